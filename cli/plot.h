/* plot.h — `kiln plot`: training logs (the JSON lines a training program writes with
 * --log FILE) drawn as curves with cairo, to PNG or SVG (plot.c). */
#ifndef KILN_CLI_PLOT_H
#define KILN_CLI_PLOT_H

#include <stdbool.h>

typedef struct {
    const char *const *files; /* the logs, one run each */
    int nfiles;
    const char *const *metrics; /* --metric values as given: names or comma lists */
    int nmetrics;
    const char *output; /* .png or .svg */
    bool log_y;         /* the loss on a logarithmic scale */
} PlotOptions;

/* Reads the logs and writes the image. Returns 0; 1 after one message on stderr about a
 * log (missing, empty, not JSON lines, no loss) or the output; 2 when the command line
 * asks for what cannot be drawn (the output's extension, an unknown --metric). */
int plot_run(const PlotOptions *o);

/* Plot geometry, which tests/test_plot.c checks in the PNG: the image is PLOT_WIDTH wide
 * and PLOT_TITLE_H + PLOT_LOSS_H + PLOT_PANEL_H per further panel + PLOT_BOTTOM_H high.
 * Runs take the colours of PLOT_PALETTE in order (0xRRGGBB). */
#define PLOT_WIDTH 960
#define PLOT_TITLE_H 44
#define PLOT_LOSS_H 360
#define PLOT_PANEL_H 210
#define PLOT_BOTTOM_H 8
#define PLOT_MARGIN_LEFT 84
#define PLOT_MARGIN_RIGHT 24
#define PLOT_PALETTE {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf}

#endif
