package io.rdmabridge.benchmarks.report;

import java.awt.BasicStroke;
import java.awt.Color;
import java.awt.Font;
import java.awt.FontMetrics;
import java.awt.Graphics2D;
import java.awt.RenderingHints;
import java.awt.image.BufferedImage;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import javax.imageio.ImageIO;

/**
 * A minimal PNG line chart drawn with java.awt in headless mode: message size on a log2 x axis, one line per series,
 * a linear or log10 y axis, an optional horizontal target line. Enough for throughput, latency and ratio charts
 * without a plotting library. Not thread-safe.
 */
final class LineChart {
    private static final Color[] PALETTE = {new Color(0x1f77b4), new Color(0xd62728), new Color(0x2ca02c),
        new Color(0xff7f0e), new Color(0x9467bd), new Color(0x8c564b)};
    private static final int WIDTH = 900;
    private static final int HEIGHT = 520;
    private static final int LEFT = 90;
    private static final int RIGHT = 200;
    private static final int TOP = 50;
    private static final int BOTTOM = 60;

    private final String title;
    private final String yLabel;
    private final boolean logY;
    private final Map<String, double[][]> series = new LinkedHashMap<>();
    private double target = Double.NaN;
    private String targetLabel;

    LineChart(String title, String yLabel, boolean logY) {
        this.title = title;
        this.yLabel = yLabel;
        this.logY = logY;
    }

    /** Adds a series of (message size, value) points; non-positive or NaN values are skipped. */
    LineChart series(String name, List<double[]> points) {
        List<double[]> kept = new ArrayList<>();
        for (double[] p : points) {
            if (p[0] > 0 && p[1] > 0 && !Double.isNaN(p[1]) && !Double.isInfinite(p[1])) {
                kept.add(p);
            }
        }
        if (!kept.isEmpty()) {
            series.put(name, kept.toArray(new double[0][]));
        }
        return this;
    }

    LineChart target(double value, String label) {
        target = value;
        targetLabel = label;
        return this;
    }

    boolean isEmpty() {
        return series.isEmpty();
    }

    void write(Path file) throws IOException {
        System.setProperty("java.awt.headless", "true");
        BufferedImage image = new BufferedImage(WIDTH, HEIGHT, BufferedImage.TYPE_INT_RGB);
        Graphics2D g = image.createGraphics();
        try {
            draw(g);
        } finally {
            g.dispose();
        }
        ImageIO.write(image, "png", file.toFile());
    }

    private void draw(Graphics2D g) {
        g.setRenderingHint(RenderingHints.KEY_ANTIALIASING, RenderingHints.VALUE_ANTIALIAS_ON);
        g.setRenderingHint(RenderingHints.KEY_TEXT_ANTIALIASING, RenderingHints.VALUE_TEXT_ANTIALIAS_ON);
        g.setColor(Color.WHITE);
        g.fillRect(0, 0, WIDTH, HEIGHT);
        double minX = Double.MAX_VALUE;
        double maxX = 0;
        double minY = Double.MAX_VALUE;
        double maxY = 0;
        for (double[][] pts : series.values()) {
            for (double[] p : pts) {
                minX = Math.min(minX, p[0]);
                maxX = Math.max(maxX, p[0]);
                minY = Math.min(minY, p[1]);
                maxY = Math.max(maxY, p[1]);
            }
        }
        if (!Double.isNaN(target)) {
            minY = Math.min(minY, target);
            maxY = Math.max(maxY, target);
        }
        if (series.isEmpty()) {
            minX = 1;
            maxX = 2;
            minY = 1;
            maxY = 2;
        }
        double x0 = log2(minX);
        double x1 = Math.max(log2(maxX), x0 + 1);
        double y0;
        double y1;
        if (logY) {
            y0 = Math.floor(Math.log10(minY));
            y1 = Math.max(Math.ceil(Math.log10(maxY)), y0 + 1);
        } else {
            y0 = 0;
            y1 = maxY * 1.1;
        }
        int plotW = WIDTH - LEFT - RIGHT;
        int plotH = HEIGHT - TOP - BOTTOM;
        g.setFont(new Font(Font.SANS_SERIF, Font.BOLD, 16));
        g.setColor(Color.BLACK);
        g.drawString(title, LEFT, 30);
        g.setFont(new Font(Font.SANS_SERIF, Font.PLAIN, 12));
        FontMetrics fm = g.getFontMetrics();
        // Grid and axes.
        g.setColor(new Color(0xdddddd));
        for (int e = (int) Math.ceil(x0); e <= x1; e++) {
            int px = LEFT + (int) ((e - x0) / (x1 - x0) * plotW);
            g.drawLine(px, TOP, px, TOP + plotH);
        }
        int ticks = logY ? (int) (y1 - y0) : 5;
        for (int i = 0; i <= ticks; i++) {
            int py = TOP + plotH - i * plotH / ticks;
            g.setColor(new Color(0xdddddd));
            g.drawLine(LEFT, py, LEFT + plotW, py);
            g.setColor(Color.BLACK);
            double v = logY ? Math.pow(10, y0 + i) : y0 + (y1 - y0) * i / ticks;
            String label = formatNumber(v);
            g.drawString(label, LEFT - 8 - fm.stringWidth(label), py + 4);
        }
        g.setColor(Color.BLACK);
        g.drawRect(LEFT, TOP, plotW, plotH);
        for (int e = (int) Math.ceil(x0); e <= x1; e++) {
            int px = LEFT + (int) ((e - x0) / (x1 - x0) * plotW);
            String label = formatSize(Math.pow(2, e));
            if (e % 2 == 0 || x1 - x0 <= 12) {
                g.drawString(label, px - fm.stringWidth(label) / 2, TOP + plotH + 18);
            }
        }
        g.drawString("message size", LEFT + plotW / 2 - 35, HEIGHT - 18);
        Graphics2D rotated = (Graphics2D) g.create();
        rotated.rotate(-Math.PI / 2);
        rotated.drawString(yLabel, -(TOP + plotH / 2 + fm.stringWidth(yLabel) / 2), 20);
        rotated.dispose();
        if (!Double.isNaN(target)) {
            int py = yPixel(target, y0, y1, plotH);
            g.setColor(Color.GRAY);
            g.setStroke(new BasicStroke(1.5f, BasicStroke.CAP_BUTT, BasicStroke.JOIN_MITER, 10, new float[] {6, 4}, 0));
            g.drawLine(LEFT, py, LEFT + plotW, py);
            g.drawString(targetLabel, LEFT + plotW + 10, py + 4);
        }
        int legendY = TOP + 10;
        int c = 0;
        for (Map.Entry<String, double[][]> e : series.entrySet()) {
            Color color = PALETTE[c++ % PALETTE.length];
            g.setColor(color);
            g.setStroke(new BasicStroke(2.2f));
            double[][] pts = e.getValue();
            int prevX = -1;
            int prevY = -1;
            for (double[] p : pts) {
                int px = LEFT + (int) ((log2(p[0]) - x0) / (x1 - x0) * plotW);
                int py = yPixel(p[1], y0, y1, plotH);
                g.fillOval(px - 4, py - 4, 8, 8);
                if (prevX >= 0) {
                    g.drawLine(prevX, prevY, px, py);
                }
                prevX = px;
                prevY = py;
            }
            g.fillRect(LEFT + plotW + 10, legendY + 25, 14, 4);
            g.setColor(Color.BLACK);
            g.drawString(e.getKey(), LEFT + plotW + 30, legendY + 31);
            legendY += 20;
        }
    }

    private int yPixel(double v, double y0, double y1, int plotH) {
        double f = logY ? (Math.log10(v) - y0) / (y1 - y0) : (v - y0) / (y1 - y0);
        return TOP + plotH - (int) (f * plotH);
    }

    private static double log2(double v) {
        return Math.log(v) / Math.log(2);
    }

    static String formatSize(double bytes) {
        if (bytes >= 1 << 20) {
            return String.format(Locale.ROOT, "%.0f MiB", bytes / (1 << 20));
        }
        if (bytes >= 1 << 10) {
            return String.format(Locale.ROOT, "%.0f KiB", bytes / (1 << 10));
        }
        return String.format(Locale.ROOT, "%.0f B", bytes);
    }

    private static String formatNumber(double v) {
        if (v == 0) {
            return "0";
        }
        if (Math.abs(v) >= 1e4 || Math.abs(v) < 1e-2) {
            return String.format(Locale.ROOT, "%.0e", v);
        }
        return String.format(Locale.ROOT, Math.abs(v) < 10 ? "%.2f" : "%.0f", v);
    }
}
