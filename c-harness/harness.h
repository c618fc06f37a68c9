/*
 * harness.h — helpers shared by kiln's C harness programs (run_model.c,
 * virtual_devices.c). They use ONNX Runtime the way a C application does:
 * linked against libonnxruntime, through the OrtApi table that
 * include/kiln_ort_abi.h declares, and kiln's own export from kiln_ep.h.
 *
 * Every failure prints "FAIL: ..." on stderr and exits with status 1.
 */
#ifndef KILN_C_HARNESS_H
#define KILN_C_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln_ep.h" /* includes kiln_ort_abi.h */

#define KILN_EP_NAME "KilnExecutionProvider"
#define KILN_VENDOR "kiln"

/* kiln_ep.h's declaration and the pointer we look up with dlsym must agree. */
typedef size_t (*kiln_ep_stats_raw_fn)(KilnStats*, size_t);
_Static_assert(_Generic(&kiln_ep_stats, kiln_ep_stats_raw_fn: 1, default: 0),
               "kiln_ep_stats in kiln_ep.h is not size_t(KilnStats*, size_t)");

/* What the harness programs call: a snapshot of kiln's counters. */
typedef KilnStats (*kiln_ep_stats_fn)(void);

/*
 * The driver (driver.rs) passes the size of the library's KilnStats as the
 * Rust code defines it; a stale kiln_ep.h would otherwise let kiln_ep_stats()
 * write past the caller's struct.
 */
#ifdef KILN_STATS_SIZE_FROM_RUST
_Static_assert(sizeof(KilnStats) == KILN_STATS_SIZE_FROM_RUST,
               "KilnStats in include/kiln_ep.h differs in size from the library's: "
               "the header is stale, regenerate it (make header)");
#endif

/* The OrtApi table (ORT_API_VERSION), set by harness_init. */
extern const OrtApi* g_ort;

/* Prints "FAIL: <message>" on stderr and exits with status 1. */
_Noreturn void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* Dies (naming `what`, the code and message) when `status` is an error. */
void check_status(OrtStatus* status, const char* what, const char* file, int line);
#define ORT_CHECK(expr) check_status((expr), #expr, __FILE__, __LINE__)

/* Prints where and which condition failed, then the message; exits 1. */
_Noreturn void fail_at(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fails with a printf-style message unless `cond` holds. */
#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) fail_at(__FILE__, __LINE__, #cond, __VA_ARGS__);             \
  } while (0)

/* Fetches the OrtApi table and prints ORT's version. */
void harness_init(void);

/* dlopens kiln's library (the path ORT will load) and looks up kiln_ep_stats. */
kiln_ep_stats_fn load_kiln_stats(const char* kiln_path, void** handle);
void print_stats(const char* label, KilnStats s);

/* ---- devices ------------------------------------------------------------ */

typedef struct DeviceInfo {
  const OrtEpDevice* device;
  const char* ep_name;
  const char* ep_vendor;
  const char* target;     /* EP metadata kiln.target, or NULL */
  const char* hw_target;  /* hardware metadata kiln.target, or NULL */
  const char* opt_target; /* EP option target, or NULL */
  const char* opt_disabled_ops; /* EP option disabled_ops, or NULL */
  const char* hw_vendor;
  uint32_t hw_vendor_id;
  OrtHardwareDeviceType hw_type;
  int is_virtual; /* hardware metadata is_virtual == "1" */
} DeviceInfo;

/* A key's value, or NULL (also for NULL `kvps`). */
const char* kv_get(const OrtKeyValuePairs* kvps, const char* key);

/* Reads what ORT reports about an OrtEpDevice. */
DeviceInfo device_info(const OrtEpDevice* device);

/* Prints every device ORT lists; returns how many. */
size_t print_devices(const OrtEnv* env);

/* Fills `out` (room for `max`) with kiln's devices; returns how many. */
size_t kiln_devices(const OrtEnv* env, DeviceInfo* out, size_t max);

/* ---- sessions and tensors ----------------------------------------------- */

#define MAX_RANK 8

typedef struct Tensor {
  int64_t shape[MAX_RANK];
  size_t rank;
  size_t count;
  float* data; /* malloc'ed */
} Tensor;

/* Deterministic values in [-2, 2], as the Rust tests' Tensor::pattern. */
Tensor tensor_pattern(const int64_t* shape, size_t rank, uint32_t seed);
void tensor_free(Tensor* t);

/* One EP option. */
typedef struct Option {
  const char* key;
  const char* value;
} Option;

/*
 * Creates a session on `model_path`. With `device`, appends its EP via
 * SessionOptionsAppendExecutionProvider_V2 with `options`; without, the
 * session uses ORT's CPU EP only. `no_fallback` sets
 * session.disable_cpu_ep_fallback=1. On failure returns NULL and the
 * (unreleased) status in `*error` when `error` is not NULL, else dies.
 */
OrtSession* create_session(OrtEnv* env, const char* model_path, const OrtEpDevice* device,
                           const Option* options, size_t num_options, int no_fallback,
                           OrtStatus** error);

/*
 * True when `status` is kiln's INVALID_ARGUMENT from session creation:
 * ORT_INVALID_ARGUMENT itself, or (what ORT 1.31.1 does with a failed
 * OrtEpFactory::CreateEp, see PluginExecutionProviderFactory::CreateProvider)
 * ORT_FAIL "Error creating execution provider: [ONNXRuntimeError] : 2 :
 * INVALID_ARGUMENT : <kiln's message>". `*form` names which.
 */
int is_invalid_argument(const OrtStatus* status, const char** form);

/* Runs `session` on float inputs; fills `outputs` (malloc'ed copies). */
void run_session(OrtSession* session, const char* const* input_names, const Tensor* inputs,
                 size_t num_inputs, const char* const* output_names, Tensor* outputs,
                 size_t num_outputs);

/*
 * Compares `got` (kiln) with `want` (CPU EP): same shape, every element
 * within 1e-6 + 1e-5 * |want|. Returns the largest absolute difference;
 * dies on a mismatch naming the element.
 */
double expect_close(const char* what, const Tensor* got, const Tensor* want);

/*
 * Compiles `input` to `output` for `device` through OrtCompileApi with embed
 * mode 0 and the given compile flags. `share` adds ep.share_ep_contexts=1
 * and `stop` ep.stop_share_ep_contexts=1 (a weight-sharing group).
 */
void compile_to_file(OrtEnv* env, const OrtEpDevice* device, const char* input, const char* output,
                     uint32_t flags, int share, int stop);

/* Joins a directory and a file name (malloc'ed). */
char* path_join(const char* dir, const char* name);

#endif /* KILN_C_HARNESS_H */
