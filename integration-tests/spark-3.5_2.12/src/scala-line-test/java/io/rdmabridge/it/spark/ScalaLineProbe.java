package io.rdmabridge.it.spark;

import java.lang.reflect.InvocationTargetException;
import org.apache.spark.SparkConf;

/**
 * Builds the shuffle manager exactly as Spark's {@code ShuffleManager.create} does (reflectively, by its
 * {@code (SparkConf, boolean)} constructor) and prints what came of it: {@code STARTED} or the failure's class and
 * message. Run in a child JVM by {@link RdmaShuffleScalaLineTest} with a chosen drop-in jar.
 */
public final class ScalaLineProbe {
    private ScalaLineProbe() {
    }

    public static void main(String[] args) throws Exception {
        try {
            Object manager = Class.forName("io.rdmabridge.spark.RdmaShuffleManager")
                    .getConstructor(SparkConf.class, boolean.class)
                    .newInstance(new SparkConf(false), Boolean.FALSE);
            System.out.println("STARTED " + manager.getClass().getName());
        } catch (InvocationTargetException e) {
            Throwable cause = e.getCause();
            System.out.println("FAILED " + cause.getClass().getName() + ": " + cause.getMessage());
        }
    }
}
