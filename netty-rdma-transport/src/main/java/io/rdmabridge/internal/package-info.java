/**
 * Not API: plumbing shared by this project's modules (the DiSNI provider, the Kafka plugin), which may change in any
 * release. Applications use {@code io.rdmabridge.netty} and the framework adapters.
 */
package io.rdmabridge.internal;
