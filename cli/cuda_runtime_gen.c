/* cuda_runtime_gen.c — run when Kiln is built (CMake): the runtime's CUDA files compiled
 * once for every GPU program, as the C runtime is. `cuda_runtime_gen DIR device` (or
 * `dist`) compiles runtime/cuda/device.cu's (programs/dist_nccl.cu's) kernels with NVRTC
 * for sm_80 and sm_90 (cuda_report.h) and writes DIR/kiln_cuda_device_code.cpp (the table
 * of its device code, cuda_embed.h, the CUBINs beside it) and DIR/device_host.cpp, its
 * host code (cuda_device.h), which CMake compiles into libkiln_cuda_device.a
 * (libkiln_cuda_dist.a). A kernel that spills registers fails the build. */
#include <stdio.h>
#include <string.h>

#include "cuda_embed.h"

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "device") && strcmp(argv[2], "dist"))) {
        fprintf(stderr, "usage: cuda_runtime_gen DIR device|dist\n");
        return 2;
    }
    const bool dist = !strcmp(argv[2], "dist");
    const char *dir = argv[1];
    StrBuf log;
    sb_init(&log);
    CudaUnit u;
    CudaCompiled c;
    memset(&c, 0, sizeof c);
    int rc = cuda_embed_read_unit(dist ? CUDA_UNIT_DIST : CUDA_UNIT_DEVICE, NULL, &u, &log);
    if (!rc) rc = cuda_units_compile(&u, 1, &c, &log);
    if (!rc && c.report.spilling) {
        StrBuf r;
        sb_init(&r);
        cuda_report_format(&c.report, &r);
        sb_printf(&log, "%s's kernels spill registers:\n%s", u.file, r.data);
        sb_free(&r);
        rc = -1;
    }
    if (!rc) rc = cuda_embed_write_table(dir, dist ? CUDA_EMBED_DIST_TABLE : CUDA_EMBED_DEVICE_TABLE, &u, 1, &c, &log);
    if (!rc) {
        StrBuf path;
        sb_init(&path);
        sb_printf(&path, "%s/%s_host.cpp", dir, argv[2]);
        rc = cuda_embed_write_file(path.data, u.src.host.data ? u.src.host.data : "", u.src.host.len, &log);
        sb_free(&path);
    }
    if (rc) fprintf(stderr, "cuda_runtime_gen %s: %s\n", argv[2], log.data ? log.data : "");
    else printf("cuda_runtime_gen: %s's %d kernels compiled by %s for sm_80 and sm_90\n", u.file, c.report.kernels_per_arch[0], nvrtc_version());
    cuda_compiled_free(&c);
    if (u.src.text.data || u.src.host.data) cuda_device_source_free(&u.src);
    sb_free(&log);
    return rc ? 1 : 0;
}
