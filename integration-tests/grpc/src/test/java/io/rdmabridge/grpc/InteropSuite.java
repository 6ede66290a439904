package io.rdmabridge.grpc;

import io.grpc.testing.integration.RdmaBridgeInteropCases;
import org.junit.platform.engine.DiscoverySelector;
import org.junit.platform.engine.TestExecutionResult;
import org.junit.platform.engine.discovery.DiscoverySelectors;
import org.junit.platform.launcher.Launcher;
import org.junit.platform.launcher.LauncherDiscoveryRequest;
import org.junit.platform.launcher.TestExecutionListener;
import org.junit.platform.launcher.TestIdentifier;
import org.junit.platform.launcher.core.LauncherDiscoveryRequestBuilder;
import org.junit.platform.launcher.core.LauncherFactory;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Runs gRPC's interop suite ({@link RdmaBridgeInteropCases}) through the JUnit Platform's vintage engine and tells
 * the outcome of every case, so that a test can compare transports case by case.
 */
final class InteropSuite {
    /** How one case ended. */
    enum Outcome {
        PASSED, FAILED, SKIPPED
    }

    /** Every case of one run, by method name, with the failure's description where one failed. */
    record Run(String name, Map<String, Outcome> outcomes, Map<String, String> failures) {
        List<String> failed() {
            List<String> names = new ArrayList<>();
            outcomes.forEach((k, v) -> {
                if (v == Outcome.FAILED) {
                    names.add(k);
                }
            });
            return names;
        }

        long count(Outcome outcome) {
            return outcomes.values().stream().filter(o -> o == outcome).count();
        }

        @Override
        public String toString() {
            return name + ": " + count(Outcome.PASSED) + " passed, " + count(Outcome.FAILED) + " failed "
                    + failed() + ", " + count(Outcome.SKIPPED) + " skipped";
        }
    }

    private InteropSuite() {
    }

    /** Every case of the suite against {@code target}. */
    static Run runAll(String name, RdmaBridgeInteropCases.Target target) {
        return run(name, target, List.of(DiscoverySelectors.selectClass(RdmaBridgeInteropCases.class)));
    }

    /**
     * The named cases of the suite against {@code target}, {@code times} over: a case counts as failed when any of
     * its runs failed (the failure kept is the first), as skipped when every run was skipped.
     */
    static Run repeatCases(String name, RdmaBridgeInteropCases.Target target, List<String> cases, int times) {
        List<DiscoverySelector> selectors = new ArrayList<>();
        for (String c : cases) {
            selectors.add(DiscoverySelectors.selectMethod(RdmaBridgeInteropCases.class, c));
        }
        Map<String, Outcome> outcomes = new TreeMap<>();
        Map<String, String> failures = new TreeMap<>();
        Map<String, Integer> failedRuns = new TreeMap<>();
        for (int i = 0; i < times; i++) {
            Run run = run(name, target, selectors);
            run.outcomes().forEach((c, o) -> {
                Outcome before = outcomes.get(c);
                if (o == Outcome.FAILED) {
                    failedRuns.merge(c, 1, Integer::sum);
                    failures.putIfAbsent(c, run.failures().get(c));
                    outcomes.put(c, Outcome.FAILED);
                } else if (before == null || before == Outcome.SKIPPED) {
                    outcomes.put(c, o);
                }
            });
        }
        failedRuns.forEach((c, n) -> failures.put(c, "failed " + n + " of " + times + " runs, first: "
                + failures.get(c)));
        return new Run(name + " x " + times, outcomes, failures);
    }

    /** Prints a run and its failures. */
    static Run report(Run run) {
        System.out.println(run);
        run.failures().forEach((k, v) -> System.out.println("  " + k + ": " + v));
        return run;
    }

    /**
     * Fails when a case that passed in every NIO run failed in any RDMA run (a case the NIO control fails too says
     * nothing about the channel); and when the control itself ran too little of the suite to mean anything.
     */
    static void assertNoRegression(List<Run> nio, List<Run> rdma) {
        for (Run run : nio) {
            assertTrue(run.count(Outcome.PASSED) >= run.outcomes().size() / 2,
                    "the NIO control passed less than half of the suite: " + run);
        }
        List<String> regressions = new ArrayList<>();
        for (Run r : rdma) {
            for (String c : r.failed()) {
                boolean nioPassed = nio.stream().anyMatch(n -> n.outcomes().containsKey(c))
                        && nio.stream().noneMatch(n -> n.outcomes().get(c) == Outcome.FAILED);
                if (nioPassed) {
                    regressions.add(r.name() + ": " + c + ": " + r.failures().get(c));
                }
            }
        }
        assertEquals(List.of(), regressions, "cases that pass on NIO and fail on RDMA");
    }

    private static Run run(String name, RdmaBridgeInteropCases.Target target,
                           List<? extends DiscoverySelector> selectors) {
        RdmaBridgeInteropCases.target = target;
        Map<String, Outcome> outcomes = new TreeMap<>();
        Map<String, String> failures = new TreeMap<>();
        LauncherDiscoveryRequest request = LauncherDiscoveryRequestBuilder.request().selectors(selectors)
                .configurationParameter("junit.jupiter.extensions.autodetection.enabled", "false").build();
        Launcher launcher = LauncherFactory.create();
        launcher.execute(request, new TestExecutionListener() {
            @Override
            public void executionSkipped(TestIdentifier id, String reason) {
                if (id.isTest()) {
                    outcomes.put(id.getDisplayName(), Outcome.SKIPPED);
                }
            }

            @Override
            public void executionFinished(TestIdentifier id, TestExecutionResult result) {
                if (!id.isTest()) {
                    return;
                }
                switch (result.getStatus()) {
                    case SUCCESSFUL:
                        outcomes.put(id.getDisplayName(), Outcome.PASSED);
                        break;
                    case ABORTED:
                        // An assumption that does not hold here (a server in another process, say).
                        outcomes.put(id.getDisplayName(), Outcome.SKIPPED);
                        break;
                    default:
                        outcomes.put(id.getDisplayName(), Outcome.FAILED);
                        failures.put(id.getDisplayName(), result.getThrowable().map(String::valueOf).orElse("?"));
                }
            }
        });
        if (outcomes.isEmpty()) {
            throw new AssertionError(name + ": the interop suite ran no case (is the vintage engine on the class"
                    + " path, and do the case names exist?)");
        }
        return new Run(name, outcomes, failures);
    }
}
