/* kiln_rt.h — the public interface of Kiln's runtime library, which generated training
 * and inference programs link against: data loading, optimizers, learning-rate schedules,
 * safetensors checkpoints. Independent of the compiler (no IR here), so a generated
 * program needs only this header, this library, libm, zlib, pthreads and a BLAS.
 *
 * Every function returns a krt_status and fills a krt_error whose message names the file
 * (or the argument) and what is wrong; nothing here calls exit() or prints. */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the CUDA target's C++ calls it too */
#endif

#define KRT_MAX_RANK 8

typedef enum {
    KRT_OK = 0,
    KRT_EIO,       /* cannot open, read or write a file */
    KRT_EFORMAT,   /* a file is truncated, corrupted or not of the expected format */
    KRT_EINVAL,    /* an argument or value is out of range */
    KRT_ENOMEM,
    KRT_ENOSPC,    /* the disk is full */
    KRT_EMISMATCH, /* a file belongs to another model, or shapes/dtypes differ */
} krt_status;

typedef struct {
    krt_status code;
    char msg[1024]; /* "path: what is wrong" */
} krt_error;

const char *krt_status_name(krt_status s);

/* Same order and sizes as the compiler's dtypes (ir/ir.h). */
typedef enum { KRT_BOOL, KRT_U8, KRT_I32, KRT_I64, KRT_F16, KRT_BF16, KRT_F32, KRT_F64, KRT_DTYPE_COUNT } krt_dtype;
size_t krt_dtype_size(krt_dtype t);
const char *krt_dtype_name(krt_dtype t);

/* An n-d array, row-major, owning its data (free with krt_array_free). */
typedef struct {
    krt_dtype dtype;
    int rank;
    int64_t dims[KRT_MAX_RANK];
    void *data;
    size_t nbytes;
} krt_array;
void krt_array_free(krt_array *a);
int64_t krt_array_count(const krt_array *a);

/* ---- data (data.c) ---- */

/* IDX files (plain or gzip, detected by content): u8, i8, i16, i32, f32, f64 element
 * types. The header's dims must match the file's size exactly. */
krt_status krt_idx_load(const char *path, krt_array *out, krt_error *err);
/* NumPy .npy (format 1.0/2.0/3.0, C order, little-endian): |b1 |u1 <i4 <i8 <f4 <f8. */
krt_status krt_npy_load(const char *path, krt_array *out, krt_error *err);
/* Writes a .npy file (format 1.0, C order, little-endian) of count(dims) elements of dtype
 * (not bf16, which NumPy lacks), through a temporary file renamed into place. */
krt_status krt_npy_write(const char *path, krt_dtype dtype, int rank, const int64_t *dims, const void *data, krt_error *err);
/* Any of the formats above, chosen by the file's first bytes, not its name: IDX (00 00
 * type rank), gzip-compressed IDX (1f 8b), .npy (\x93NUMPY), token file (KILNTOK1). A
 * file of none of them is KRT_EFORMAT naming the file and the formats tried. */
krt_status krt_array_load(const char *path, krt_array *out, krt_error *err);
/* An ONNX TensorProto file (.pb: one tensor, as the ONNX test suites write them; float,
 * double, int64, int32, uint8 or bool), which krt_array_load reads for a name ending .pb
 * (tensor_pb.c). A scalar is one element of rank 1. */
krt_status krt_tensorproto_load(const char *path, krt_array *out, krt_error *err);
/* The bytes of every file matching the glob `pattern`, minus those whose base name
 * matches the glob `exclude` (NULL or "" for none), sorted by name, concatenated: a u8
 * array of one dimension. An empty result is an error. */
krt_status krt_text_load(const char *pattern, const char *exclude, krt_array *out, krt_error *err);
/* Token files (docs/formats.md): a 16-byte header "KILNTOK1", u32 bytes per token (2 or
 * 4), u32 reserved 0; then u64 count; then the tokens, little-endian. Loaded as I32. */
krt_status krt_tokens_load(const char *path, krt_array *out, krt_error *err);
/* Writes a token file atomically; width is 2 or 4; every token must fit. */
krt_status krt_tokens_write(const char *path, const int32_t *tokens, int64_t count, int width, krt_error *err);

/* Where a dataset's iteration stands; saved in checkpoints so resume is exact. */
typedef struct {
    uint64_t seed;
    int64_t epoch;    /* 0-based */
    int64_t position; /* samples of this epoch already delivered */
} krt_cursor;

typedef struct krt_dataset krt_dataset;

/* Samples are rows (axis 0) of n arrays of equal length, rows [first, first + count). */
krt_dataset *krt_dataset_rows(const krt_array *arrays, int n, int64_t first, int64_t count, krt_error *err);
/* Language-model windows over a 1-D token stream, tokens [first, first + count): sample i
 * is input = tokens[o, o + T), target = tokens[o + 1, o + T + 1) for the window start o
 * of sample i (non-overlapping windows; the epoch's order of windows is shuffled). */
krt_dataset *krt_dataset_windows(const krt_array *stream, int64_t T, int64_t first, int64_t count, krt_error *err);
int64_t krt_dataset_size(const krt_dataset *ds); /* samples per epoch */
int krt_dataset_arity(const krt_dataset *ds);    /* arrays per sample (2 for windows) */
void krt_dataset_free(krt_dataset *ds);

/* Fills the next batch at the cursor: dst[k] receives `batch` samples of array k,
 * converted to dtypes[k], contiguous. With shuffle, each epoch's order is a seeded
 * permutation (seed, epoch); the cursor advances, moving to the next epoch at its end
 * (a final partial batch is dropped when drop_last). *got is the samples delivered. */
krt_status krt_dataset_next(krt_dataset *ds, krt_cursor *cur, int64_t batch, bool shuffle, bool drop_last, void *const *dst,
                            const krt_dtype *dtypes, int64_t *got, krt_error *err);

/* A background thread that prepares the next batch while the current one trains;
 * results are identical to calling krt_dataset_next directly. */
typedef struct krt_prefetch krt_prefetch;
krt_prefetch *krt_prefetch_start(krt_dataset *ds, krt_cursor cur, int64_t batch, bool shuffle, bool drop_last,
                                 const krt_dtype *dtypes, krt_error *err);
/* Copies the next batch into dst (as krt_dataset_next) and its cursor after it. */
krt_status krt_prefetch_next(krt_prefetch *p, void *const *dst, int64_t *got, krt_cursor *after, krt_error *err);
void krt_prefetch_stop(krt_prefetch *p);

/* ---- optimizers and schedules (optim.c, sched.c) ---- */

typedef enum { KRT_SGD, KRT_ADAM, KRT_ADAMW, KRT_RMSPROP, KRT_ADAGRAD, KRT_LION } krt_optim_kind;

typedef struct {
    krt_optim_kind kind;
    double lr;
    double momentum, dampening; /* SGD; momentum also RMSprop's */
    bool nesterov;              /* SGD */
    double beta1, beta2, eps;   /* Adam, AdamW, Lion (betas); eps: Adam, AdamW, RMSprop, Adagrad */
    bool amsgrad;               /* Adam, AdamW: keep the maximum of the second moments */
    double alpha;               /* RMSprop: smoothing constant */
    bool centered;              /* RMSprop: divide by the centred second moment */
    double lr_decay;            /* Adagrad: lr / (1 + (step - 1) * lr_decay) */
    double initial_accumulator_value; /* Adagrad: the sum's initial value */
    double weight_decay;        /* SGD, Adam, RMSprop, Adagrad: L2 added to the gradient; AdamW, Lion: decoupled */
} krt_optim_config;

/* One parameter tensor inside the flat parameter slab. */
typedef struct {
    int64_t offset, count;
    bool decay;           /* weight decay applies (by default: tensors of rank >= 2) */
    bool grouped;         /* in a parameter group: lr and weight_decay below replace the rate */
    double lr, weight_decay; /* passed to krt_optim_step and the config's weight_decay */
} krt_param_span;

/* Optimizer state: up to KRT_OPTIM_SLABS slabs the size of the parameter slab, each
 * NULL when the optimizer does not use it; krt_optim_slab_name gives their names (as
 * torch.optim's state keys) in checkpoints:
 *   SGD      m: momentum buffer (checkpoint name exp_avg, as Kiln always wrote it)
 *   Adam(W)  m: exp_avg, v: exp_avg_sq, w: max_exp_avg_sq (amsgrad)
 *   RMSprop  m: momentum_buffer (momentum > 0), v: square_avg, w: grad_avg (centered)
 *   Adagrad  v: sum
 *   Lion     m: exp_avg */
typedef struct {
    float *m, *v, *w;
    int64_t n;
    int64_t step;    /* optimizer steps taken (Adam bias correction), starts at 0 */
} krt_optim_state;
#define KRT_OPTIM_SLABS 3

/* Slab k (0: m, 1: v, 2: w) of s, and its name under config c (NULL when c does not
 * use it). */
float **krt_optim_slab(krt_optim_state *s, int k);
const char *krt_optim_slab_name(const krt_optim_config *c, int k);
krt_status krt_optim_init(krt_optim_state *s, const krt_optim_config *c, int64_t n, krt_error *err);
void krt_optim_free(krt_optim_state *s);
/* One update of params from grads with learning rate lr, exactly as torch.optim does it. */
void krt_optim_step(const krt_optim_config *c, krt_optim_state *s, double lr, float *params, const float *grads,
                    const krt_param_span *spans, int nspans);
/* Global L2 norm of the gradients (accumulated in double). */
double krt_grad_norm(const float *grads, int64_t n);
/* Scales grads so that their norm is at most max_norm (torch.nn.utils.clip_grad_norm_:
 * factor max_norm / (norm + 1e-6) when norm > max_norm); returns the norm before. */
double krt_clip_grad_norm(float *grads, int64_t n, double max_norm);
/* fp16 loss scaling's unscale: grads *= inv_scale, in the same pass as their norm (summed
 * as krt_grad_norm sums), then clipped to max_norm as krt_clip_grad_norm clips when
 * max_norm > 0. Returns the norm of the unscaled gradients before clipping: infinite or
 * NaN exactly when some gradient is (the step is then skipped; nothing is clipped). */
double krt_unscale_clip_grad_norm(float *grads, int64_t n, float inv_scale, double max_norm);


typedef enum {
    KRT_SCHED_CONSTANT,
    KRT_SCHED_STEP,
    KRT_SCHED_LINEAR,
    KRT_SCHED_COSINE,
    KRT_SCHED_ONECYCLE,        /* torch.optim.lr_scheduler.OneCycleLR */
    KRT_SCHED_EXPONENTIAL,     /* ExponentialLR, stepped every optimizer step */
    KRT_SCHED_POLYNOMIAL,      /* PolynomialLR */
    KRT_SCHED_COSINE_RESTARTS, /* CosineAnnealingWarmRestarts, stepped every optimizer step */
} krt_sched_kind;
typedef struct {
    krt_sched_kind kind;
    int64_t warmup;      /* linear warmup steps from 0 (all but ONECYCLE) */
    int64_t step_size;   /* STEP */
    double gamma;        /* STEP, EXPONENTIAL */
    double min_lr;       /* LINEAR, COSINE: value at total_steps; COSINE_RESTARTS: eta_min */
    int64_t total_steps; /* LINEAR, COSINE, ONECYCLE, POLYNOMIAL (when total_iters is 0): the run's steps */
    double pct_start, div_factor, final_div_factor; /* ONECYCLE */
    bool anneal_linear, three_phase;                /* ONECYCLE: anneal_strategy "linear" (else "cos"), three_phase */
    double power;                                   /* POLYNOMIAL */
    int64_t total_iters;                            /* POLYNOMIAL: 0 = total_steps - warmup */
    int64_t t0, t_mult;                             /* COSINE_RESTARTS: T_0, T_mult */
    double max_lr;                                  /* ONECYCLE: the peak for every parameter (max_lr); 0: each one's base rate */
} krt_schedule;
/* Learning rate for optimizer step `step` (0-based). */
double krt_schedule_lr(const krt_schedule *s, double base_lr, int64_t step);

/* ---- the process environment (env.c) ---- */

/* Called first in a training program's main: full speed with no environment variables.
 * Where the user did not set them, sets OMP_WAIT_POLICY=passive, OPENBLAS_CORETYPE (when
 * OpenBLAS chose kernels older than the CPU supports) and one thread count for OpenMP and
 * BLAS (every CPU the process may use); the first two are read when the libraries load,
 * so it then execs /proc/self/exe once with argv (marked by KILN_ENV_READY; when the exec
 * fails the program goes on; argc 0: no exec, for a process that loads OpenBLAS later,
 * as kiln train's JIT). Then flushes denormals to zero (x86; KILN_FTZ=0 keeps them).
 * With KILN_VERBOSE=1 prints one line on stderr saying what was chosen. */
void krt_fast_environment(int argc, char **argv);
/* LLVM's OpenMP runtime (libomp, which programs built by the compiler inside kiln use)
 * registers each process in /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> at its first parallel
 * region. A process killed while creating that file leaves it empty, and libomp 16 maps
 * and reads an existing file without checking its size: the next process given that pid
 * dies of SIGBUS (a flaky "Bus error" in the tests). The file named by this process's own
 * pid can only be such a leftover; an empty one is removed. Called by
 * krt_fast_environment, before any parallel region. */
void krt_omp_clear_stale_registration(void);
/* The CPUs this process may run on (its affinity mask), at least 1. */
int krt_cpus(void);
/* The OpenMP threads the generated kernels share their work between (1 without OpenMP). */
int krt_threads(void);
/* OpenBLAS's thread count, or 0 in a program not linked with OpenBLAS (--target cuda). */
int krt_blas_threads(void);
/* --threads N: N OpenMP threads; BLAS stays as it is, single-threaded by default
 * (reported with KILN_VERBOSE=1). */
void krt_set_threads(int n);
/* The OpenBLAS core whose kernels this CPU runs best: "SkylakeX" (AVX-512 F, BW, DQ,
 * VL), "Haswell" (AVX2 and FMA), or NULL. */
const char *krt_cpu_blas_core(void);
/* `best` when `current` is an OpenBLAS core known to be older than `best`, else NULL
 * (never for a core name it does not know). */
const char *krt_blas_core_upgrade(const char *current, const char *best);
/* The calling thread's panel buffer of kiln_gemm.h's half-precision products (`floats`
 * floats, the same at every call), made at its first call; out of memory exits. */
float *krt_hgemm_buffer(size_t floats);

/* ---- checkpoints (ckpt.c): safetensors ---- */

typedef struct {
    const char *name;
    krt_dtype dtype;
    int rank;
    int64_t dims[KRT_MAX_RANK];
    const void *data;
} krt_st_tensor;

typedef struct {
    const char *key, *value;
} krt_st_meta;

/* Writes a safetensors file (https://github.com/huggingface/safetensors format: u64 header
 * length, JSON header with dtype/shape/data_offsets per tensor and "__metadata__", then the
 * data) atomically: a temporary file in the same directory, fsync, rename, fsync of the
 * directory. On any failure (a full disk included) the previous file is left untouched. */
krt_status krt_safetensors_write(const char *path, const krt_st_tensor *tensors, int n, const krt_st_meta *meta, int nmeta,
                                 krt_error *err);

/* The same, with checksums added to the metadata: "crc32:NAME" for each tensor (CRC-32 of
 * its bytes, as zlib.crc32, 8 lowercase hex digits) and "crc32:__metadata__" for the other
 * entries (sorted by key, each as key NUL value NUL). Keys starting "crc32:" are refused
 * in meta. PyTorch's readers see them as ordinary metadata strings. */
krt_status krt_safetensors_write_checked(const char *path, const krt_st_tensor *tensors, int n, const krt_st_meta *meta, int nmeta,
                                         krt_error *err);

typedef struct krt_safetensors krt_safetensors;
/* Reads and validates a whole file: header length and JSON, dtypes, shapes, offsets
 * inside the file, contiguous and not overlapping, and, when the file has checksums
 * (krt_safetensors_write_checked), every tensor's and the metadata's. A truncated,
 * corrupted or foreign file is refused with a message naming it; a file without
 * checksums (written elsewhere) is read as it is. */
krt_status krt_safetensors_read(const char *path, krt_safetensors **out, krt_error *err);
/* The same for a file's bytes in memory (an inference program's embedded weights); `name`
 * stands for the file in messages. The bytes are copied. */
krt_status krt_safetensors_parse(const char *name, const void *data, size_t size, krt_safetensors **out, krt_error *err);
int krt_safetensors_count(const krt_safetensors *st);
/* The i-th tensor (data points into the loaded file), or NULL. */
const krt_st_tensor *krt_safetensors_tensor(const krt_safetensors *st, int i);
const krt_st_tensor *krt_safetensors_find(const krt_safetensors *st, const char *name);
const char *krt_safetensors_meta(const krt_safetensors *st, const char *key); /* or NULL */
/* The metadata entries in the header's order (the checksums included). */
int krt_safetensors_meta_count(const krt_safetensors *st);
const krt_st_meta *krt_safetensors_meta_entry(const krt_safetensors *st, int i); /* or NULL */
void krt_safetensors_free(krt_safetensors *st);

/* ---- fp16 loss scaling (loss_scale.c; docs/precision.md) ----
 * torch.cuda.amp.GradScaler's semantics: the loss (the backward pass's seed) is multiplied
 * by `scale`; the gradients are unscaled before clipping and the optimizer; a step with
 * an infinite or NaN gradient is skipped whole (no parameter, optimizer state or
 * optimizer step count changes) and, when dynamic, halves the scale; growth_interval
 * clean steps in a row double it. A static scale never changes, but its overflowing
 * steps are skipped too. */
typedef struct {
    bool dynamic;
    float scale;             /* fp32, as GradScaler's _scale */
    int64_t growth_interval; /* clean steps before the scale doubles */
    int64_t growth_tracker;  /* clean steps since it last changed (GradScaler's _growth_tracker) */
    int64_t skipped;         /* steps skipped since the run began (resumed runs included) */
} krt_loss_scaler;
/* A scaler from the recipe: mode "dynamic" (from `init`, doubling every growth_interval
 * clean steps) or a static scale written as a number. */
krt_status krt_scaler_init(krt_loss_scaler *s, const char *mode, double init, int64_t growth_interval, krt_error *err);
/* For the program's start line: "fp16 loss scale 65536, dynamic (x2 after 2000 clean
 * steps)" or "fp16 loss scale 1024, static". */
void krt_scaler_describe(const krt_loss_scaler *s, char *buf, size_t cap);
/* After a step's gradients were unscaled: GradScaler.update(). Returns whether the
 * optimizer steps (no inf/NaN found). */
bool krt_scaler_update(krt_loss_scaler *s, bool found_inf);
/* The state as checkpoint metadata (train_state.safetensors: loss_scale, exact in 9
 * significant digits; loss_scale_growth_tracker; loss_scale_skipped) and back. A file
 * without them (an older checkpoint, or one of a run without scaling) leaves the scaler as
 * initialised; invalid values are an error naming the path and key. */
#define KRT_SCALER_META 3
void krt_scaler_meta(const krt_loss_scaler *s, char buf[KRT_SCALER_META][32], krt_st_meta meta[KRT_SCALER_META]);
krt_status krt_scaler_load(krt_loss_scaler *s, const krt_safetensors *st, const char *path, int64_t steps, krt_error *err);

/* ---- checkpoint directories (ckpt_dir.c) ----
 * DIR holds one directory per checkpoint, DIR/step-NNNNNNNN (the step, 8 digits or more),
 * with model.safetensors and train_state.safetensors, and a pointer file DIR/latest whose
 * one line names the newest. A checkpoint is all-or-nothing: its files are written into
 * a temporary directory (krt_ckpt_begin), which krt_ckpt_publish renames into place after
 * syncing, then it replaces the pointer atomically; krt_ckpt_prune deletes old ones only
 * after that. Usage: prepare once at start; per checkpoint begin, write both files into
 * the temporary directory, publish (or discard on failure), prune. */

/* Creates DIR (not its parents) when missing and checks that files can be written in it;
 * removes the leftovers of saves cut short by processes that are gone. */
krt_status krt_ckpt_prepare(const char *dir, krt_error *err);
/* A new empty temporary directory for the checkpoint of `step`, its path in tmp. */
krt_status krt_ckpt_begin(const char *dir, int64_t step, char *tmp, size_t cap, krt_error *err);
/* Moves the complete temporary directory to DIR/step-NNNNNNNN (replacing one of the same
 * step), syncs DIR, then points DIR/latest at it. */
krt_status krt_ckpt_publish(const char *dir, const char *tmp, int64_t step, krt_error *err);
/* Removes a temporary directory of krt_ckpt_begin that will not be published. */
void krt_ckpt_discard(const char *tmp);
/* Keeps checkpoint `step` and the keep - 1 highest steps below it; deletes every other
 * step directory (those above `step` are an earlier run's), the files of the old layout
 * directly in DIR, and leftovers of processes that are gone. An error names the first
 * path that could not be removed; the checkpoints kept are intact either way. */
krt_status krt_ckpt_prune(const char *dir, int64_t step, int keep, krt_error *err);
/* The directory of the newest checkpoint in DIR, for resuming: the one `latest` names;
 * without a pointer (or when it names a directory that is gone: *stale_pointer) the
 * highest complete step directory; else DIR itself when it holds the files directly (the
 * layout of older Kiln versions). *step is the step in the directory's name, -1 for DIR. */
krt_status krt_ckpt_find(const char *dir, char *found, size_t cap, int64_t *step, bool *stale_pointer, krt_error *err);

/* ---- TensorBoard event files (tboard.c) ---- */

/* CRC32C (Castagnoli) of n bytes, continuing `crc` (0 to start): "123456789" gives
 * 0xE3069283. Not zlib's crc32, whose polynomial differs. */
uint32_t krt_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked CRC32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t krt_crc32c_masked(const void *data, size_t n);
/* The frame of a TFRecord of n bytes of data: header = uint64 n and the masked CRC of
 * those 8 bytes, footer = the masked CRC of the data, all little-endian. */
void krt_tfrecord_frame(uint64_t n, const void *data, unsigned char header[12], unsigned char footer[4]);

/* A writer of one event file, as torch.utils.tensorboard's SummaryWriter writes it. */
typedef struct krt_tboard krt_tboard;
/* Creates dir (and its parents) when missing and a new file in it,
 * dir/events.out.tfevents.<seconds>.<host>.<pid>, that starts with the file_version
 * event (written at once, so that an unwritable directory fails here). */
krt_status krt_tboard_open(const char *dir, krt_tboard **out, krt_error *err);
const char *krt_tboard_path(const krt_tboard *w);
/* Events of the current wall time, kept in memory until a flush: a scalar (simple_value),
 * a text (the text plugin's string tensor, as SummaryWriter.add_text), and a SessionLog
 * START at `step`, after which TensorBoard drops the events of earlier files from `step`
 * on (SummaryWriter's purge_step: a run resumed from a checkpoint before them). */
void krt_tboard_scalar(krt_tboard *w, int64_t step, const char *tag, double value);
void krt_tboard_text(krt_tboard *w, int64_t step, const char *tag, const char *text);
/* A text shown as it is (its lines, spaces, `*` and `#`): a Markdown code block, every line
 * indented by four spaces, since TensorBoard's text plugin renders Markdown. */
void krt_tboard_code(krt_tboard *w, int64_t step, const char *tag, const char *text);
void krt_tboard_restart(krt_tboard *w, int64_t step);
/* Writes the events kept. The first failure (a full disk, a file-size limit, no memory)
 * is returned once; the file is cut back to its whole records and the writer does nothing
 * more, so that the caller warns once and goes on. */
krt_status krt_tboard_flush(krt_tboard *w, krt_error *err);
/* The same, when at least `seconds` have passed since the last flush. */
krt_status krt_tboard_flush_every(krt_tboard *w, double seconds, krt_error *err);
/* Flushes (its failure returned as krt_tboard_flush's) and closes; w may be NULL. */
krt_status krt_tboard_close(krt_tboard *w, krt_error *err);

#ifdef __cplusplus
}
#endif

#endif
