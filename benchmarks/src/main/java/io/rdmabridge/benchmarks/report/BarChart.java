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
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import javax.imageio.ImageIO;

/**
 * A minimal PNG chart of horizontal bars drawn with java.awt in headless mode: one bar per named value on a linear
 * axis from zero, with an optional vertical reference line (parity for ratios). For results that have no message-size
 * axis, such as the Kafka on/off ratios. Not thread-safe.
 */
final class BarChart {
    private static final Color BAR = new Color(0x1f77b4);
    private static final int WIDTH = 900;
    private static final int ROW = 34;
    private static final int LEFT = 300;
    private static final int RIGHT = 80;
    private static final int TOP = 60;
    private static final int BOTTOM = 50;

    private final String title;
    private final String xLabel;
    private final Map<String, Double> bars = new LinkedHashMap<>();
    private double reference = Double.NaN;
    private String referenceLabel;

    BarChart(String title, String xLabel) {
        this.title = title;
        this.xLabel = xLabel;
    }

    /** Adds a bar; NaN, infinite and negative values are skipped. */
    BarChart bar(String name, double value) {
        if (!Double.isNaN(value) && !Double.isInfinite(value) && value >= 0) {
            bars.put(name, value);
        }
        return this;
    }

    BarChart reference(double value, String label) {
        reference = value;
        referenceLabel = label;
        return this;
    }

    boolean isEmpty() {
        return bars.isEmpty();
    }

    void write(Path file) throws IOException {
        System.setProperty("java.awt.headless", "true");
        int height = TOP + BOTTOM + Math.max(1, bars.size()) * ROW;
        BufferedImage image = new BufferedImage(WIDTH, height, BufferedImage.TYPE_INT_RGB);
        Graphics2D g = image.createGraphics();
        try {
            draw(g, height);
        } finally {
            g.dispose();
        }
        ImageIO.write(image, "png", file.toFile());
    }

    private void draw(Graphics2D g, int height) {
        g.setRenderingHint(RenderingHints.KEY_ANTIALIASING, RenderingHints.VALUE_ANTIALIAS_ON);
        g.setRenderingHint(RenderingHints.KEY_TEXT_ANTIALIASING, RenderingHints.VALUE_TEXT_ANTIALIAS_ON);
        g.setColor(Color.WHITE);
        g.fillRect(0, 0, WIDTH, height);
        double max = Double.isNaN(reference) ? 0 : reference;
        for (double v : bars.values()) {
            max = Math.max(max, v);
        }
        max = max <= 0 ? 1 : max * 1.15;
        int plotW = WIDTH - LEFT - RIGHT;
        int plotH = height - TOP - BOTTOM;
        g.setFont(new Font(Font.SANS_SERIF, Font.BOLD, 16));
        g.setColor(Color.BLACK);
        g.drawString(title, 20, 30);
        g.setFont(new Font(Font.SANS_SERIF, Font.PLAIN, 12));
        FontMetrics fm = g.getFontMetrics();
        // Vertical grid with five ticks.
        for (int i = 0; i <= 5; i++) {
            int px = LEFT + i * plotW / 5;
            g.setColor(new Color(0xdddddd));
            g.drawLine(px, TOP, px, TOP + plotH);
            g.setColor(Color.BLACK);
            String label = String.format(Locale.ROOT, "%.2f", max * i / 5);
            g.drawString(label, px - fm.stringWidth(label) / 2, TOP + plotH + 18);
        }
        g.drawString(xLabel, LEFT + plotW / 2 - fm.stringWidth(xLabel) / 2, height - 12);
        int y = TOP;
        for (Map.Entry<String, Double> e : bars.entrySet()) {
            int w = (int) (e.getValue() / max * plotW);
            g.setColor(BAR);
            g.fillRect(LEFT, y + 6, Math.max(1, w), ROW - 12);
            g.setColor(Color.BLACK);
            g.drawString(e.getKey(), LEFT - 10 - fm.stringWidth(e.getKey()), y + ROW / 2 + 4);
            g.drawString(String.format(Locale.ROOT, "%.2f", e.getValue()), LEFT + w + 6, y + ROW / 2 + 4);
            y += ROW;
        }
        g.drawRect(LEFT, TOP, plotW, plotH);
        if (!Double.isNaN(reference)) {
            int px = LEFT + (int) (reference / max * plotW);
            g.setColor(Color.GRAY);
            g.setStroke(new BasicStroke(1.5f, BasicStroke.CAP_BUTT, BasicStroke.JOIN_MITER, 10, new float[] {6, 4}, 0));
            g.drawLine(px, TOP - 8, px, TOP + plotH);
            g.drawString(referenceLabel, px - fm.stringWidth(referenceLabel) / 2, TOP - 12);
        }
    }
}
