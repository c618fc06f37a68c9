/* harness.c — see harness.h. C11 + POSIX (dlopen). */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const OrtApi* g_ort = NULL;

_Noreturn static void vdie(const char* prefix, const char* fmt, va_list ap) {
  fflush(stdout);
  fprintf(stderr, "FAIL: %s", prefix);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
  /* _Exit: skip ORT's static destructors, which may not expect live objects. */
  _Exit(1);
}

void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vdie("", fmt, ap);
}

void fail_at(const char* file, int line, const char* cond, const char* fmt, ...) {
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s:%d: expected `%s`: ", file, line, cond);
  va_list ap;
  va_start(ap, fmt);
  vdie(prefix, fmt, ap);
}

void check_status(OrtStatus* status, const char* what, const char* file, int line) {
  if (status == NULL) return;
  OrtErrorCode code = g_ort->GetErrorCode(status);
  const char* message = g_ort->GetErrorMessage(status);
  die("%s:%d: %s failed: ORT error %d: %s", file, line, what, (int)code,
      message ? message : "(no message)");
}

void harness_init(void) {
  const OrtApiBase* base = OrtGetApiBase();
  if (base == NULL || base->GetApi == NULL) die("OrtGetApiBase returned no API base");
  const char* version = base->GetVersionString ? base->GetVersionString() : "?";
  g_ort = base->GetApi(ORT_API_VERSION);
  if (g_ort == NULL)
    die("ONNX Runtime %s does not offer API version %d", version, ORT_API_VERSION);
  printf("ONNX Runtime %s, API version %d\n", version, ORT_API_VERSION);
}

static kiln_ep_stats_raw_fn g_kiln_stats;

static KilnStats snapshot_stats(void) {
  KilnStats s;
  memset(&s, 0, sizeof s);
  size_t size = g_kiln_stats(&s, sizeof s);
  if (size != sizeof s)
    die("the library's KilnStats is %zu bytes, include/kiln_ep.h's %zu: regenerate the header", size,
        sizeof s);
  return s;
}

kiln_ep_stats_fn load_kiln_stats(const char* kiln_path, void** handle) {
  *handle = dlopen(kiln_path, RTLD_NOW | RTLD_LOCAL);
  if (*handle == NULL) die("dlopen %s: %s", kiln_path, dlerror());
  void* sym = dlsym(*handle, "kiln_ep_stats");
  if (sym == NULL) die("dlsym kiln_ep_stats in %s: %s", kiln_path, dlerror());
  /* POSIX guarantees object and function pointers convert; memcpy keeps ISO C quiet. */
  memcpy(&g_kiln_stats, &sym, sizeof g_kiln_stats);
  return snapshot_stats;
}

void print_stats(const char* label, KilnStats s) {
  printf("kiln stats %-22s eps_created=%llu partitions_compiled=%llu nodes_compiled=%llu "
         "compute_calls=%llu\n",
         label, (unsigned long long)s.eps_created, (unsigned long long)s.partitions_compiled,
         (unsigned long long)s.nodes_compiled, (unsigned long long)s.compute_calls);
}

/* ---- devices ------------------------------------------------------------ */

const char* kv_get(const OrtKeyValuePairs* kvps, const char* key) {
  return kvps == NULL ? NULL : g_ort->GetKeyValue(kvps, key);
}

DeviceInfo device_info(const OrtEpDevice* device) {
  DeviceInfo d;
  memset(&d, 0, sizeof d);
  d.device = device;
  d.ep_name = g_ort->EpDevice_EpName(device);
  d.ep_vendor = g_ort->EpDevice_EpVendor(device);
  const OrtKeyValuePairs* meta = g_ort->EpDevice_EpMetadata(device);
  const OrtKeyValuePairs* opts = g_ort->EpDevice_EpOptions(device);
  d.target = kv_get(meta, "kiln.target");
  d.opt_target = kv_get(opts, "target");
  d.opt_disabled_ops = kv_get(opts, "disabled_ops");
  const OrtHardwareDevice* hw = g_ort->EpDevice_Device(device);
  if (hw != NULL) {
    const OrtKeyValuePairs* hw_meta = g_ort->HardwareDevice_Metadata(hw);
    d.hw_target = kv_get(hw_meta, "kiln.target");
    const char* v = kv_get(hw_meta, "is_virtual");
    d.is_virtual = v != NULL && strcmp(v, "1") == 0;
    d.hw_vendor = g_ort->HardwareDevice_Vendor(hw);
    d.hw_vendor_id = g_ort->HardwareDevice_VendorId(hw);
    d.hw_type = g_ort->HardwareDevice_Type(hw);
  }
  return d;
}

static const char* hw_type_name(OrtHardwareDeviceType t) {
  switch (t) {
    case OrtHardwareDeviceType_CPU: return "CPU";
    case OrtHardwareDeviceType_GPU: return "GPU";
    case OrtHardwareDeviceType_NPU: return "NPU";
  }
  return "?";
}

#define OR_DASH(s) ((s) ? (s) : "-")

size_t print_devices(const OrtEnv* env) {
  const OrtEpDevice* const* list = NULL;
  size_t n = 0;
  ORT_CHECK(g_ort->GetEpDevices(env, &list, &n));
  printf("%zu EP device(s):\n", n);
  for (size_t i = 0; i < n; ++i) {
    DeviceInfo d = device_info(list[i]);
    printf("  [%zu] %s (vendor %s) on %s device of %s%s; kiln.target=%s\n", i, OR_DASH(d.ep_name),
           OR_DASH(d.ep_vendor), hw_type_name(d.hw_type), OR_DASH(d.hw_vendor),
           d.is_virtual ? " (virtual)" : "", OR_DASH(d.target));
  }
  return n;
}

size_t kiln_devices(const OrtEnv* env, DeviceInfo* out, size_t max) {
  const OrtEpDevice* const* list = NULL;
  size_t n = 0, found = 0;
  ORT_CHECK(g_ort->GetEpDevices(env, &list, &n));
  for (size_t i = 0; i < n; ++i) {
    const char* name = g_ort->EpDevice_EpName(list[i]);
    if (name == NULL || strcmp(name, KILN_EP_NAME) != 0) continue;
    EXPECT(found < max, "more than %zu kiln devices", max);
    out[found++] = device_info(list[i]);
  }
  return found;
}

/* ---- sessions and tensors ----------------------------------------------- */

Tensor tensor_pattern(const int64_t* shape, size_t rank, uint32_t seed) {
  Tensor t;
  memset(&t, 0, sizeof t);
  EXPECT(rank <= MAX_RANK, "rank %zu", rank);
  t.rank = rank;
  t.count = 1;
  for (size_t i = 0; i < rank; ++i) {
    t.shape[i] = shape[i];
    t.count *= (size_t)shape[i];
  }
  t.data = malloc((t.count ? t.count : 1) * sizeof(float));
  EXPECT(t.data != NULL, "out of memory");
  for (size_t i = 0; i < t.count; ++i) {
    uint32_t v = (uint32_t)i * 2654435761u + seed * 40503u;
    t.data[i] = (float)(v % 4001u) / 1000.0f - 2.0f;
  }
  return t;
}

void tensor_free(Tensor* t) {
  free(t->data);
  t->data = NULL;
}

OrtSession* create_session(OrtEnv* env, const char* model_path, const OrtEpDevice* device,
                           const Option* options, size_t num_options, int no_fallback,
                           OrtStatus** error) {
  OrtSessionOptions* so = NULL;
  ORT_CHECK(g_ort->CreateSessionOptions(&so));
  if (no_fallback) ORT_CHECK(g_ort->AddSessionConfigEntry(so, "session.disable_cpu_ep_fallback", "1"));
  OrtStatus* status = NULL;
  if (device != NULL) {
    /* claim=all (unless set): the harness's toy graphs are ones kiln's
       default cost rule would leave to ORT. */
    const char* keys[17];
    const char* values[17];
    size_t count = 0;
    int has_claim = 0;
    EXPECT(num_options <= 16, "%zu options", num_options);
    for (size_t i = 0; i < num_options; ++i) {
      keys[count] = options[i].key;
      values[count++] = options[i].value;
      if (strcmp(options[i].key, "claim") == 0) has_claim = 1;
    }
    if (!has_claim) {
      keys[count] = "claim";
      values[count++] = "all";
    }
    const OrtEpDevice* devices[1] = {device};
    status = g_ort->SessionOptionsAppendExecutionProvider_V2(so, env, devices, 1, keys, values, count);
  }
  OrtSession* session = NULL;
  if (status == NULL) status = g_ort->CreateSession(env, model_path, so, &session);
  g_ort->ReleaseSessionOptions(so);
  if (status != NULL) {
    if (error == NULL) {
      char what[512];
      snprintf(what, sizeof what, "creating a session on %s (%s)", model_path,
               device ? "kiln device" : "CPU EP only");
      check_status(status, what, __FILE__, __LINE__);
    }
    *error = status;
    return NULL;
  }
  if (error != NULL) *error = NULL;
  return session;
}

int is_invalid_argument(const OrtStatus* status, const char** form) {
  OrtErrorCode code = g_ort->GetErrorCode(status);
  const char* message = g_ort->GetErrorMessage(status);
  if (code == ORT_INVALID_ARGUMENT) {
    *form = "ORT_INVALID_ARGUMENT";
    return 1;
  }
  if (code == ORT_FAIL && message != NULL && strstr(message, "INVALID_ARGUMENT") != NULL) {
    *form = "ORT_FAIL wrapping INVALID_ARGUMENT";
    return 1;
  }
  *form = "neither ORT_INVALID_ARGUMENT nor ORT_FAIL wrapping it";
  return 0;
}

void run_session(OrtSession* session, const char* const* input_names, const Tensor* inputs,
                 size_t num_inputs, const char* const* output_names, Tensor* outputs,
                 size_t num_outputs) {
  enum { MAX_IO = 8 };
  EXPECT(num_inputs <= MAX_IO && num_outputs <= MAX_IO, "%zu inputs, %zu outputs", num_inputs,
         num_outputs);
  OrtMemoryInfo* mem = NULL;
  ORT_CHECK(g_ort->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &mem));
  OrtValue* in_values[MAX_IO] = {0};
  OrtValue* out_values[MAX_IO] = {0};
  for (size_t i = 0; i < num_inputs; ++i) {
    ORT_CHECK(g_ort->CreateTensorWithDataAsOrtValue(
        mem, inputs[i].data, inputs[i].count * sizeof(float), inputs[i].shape, inputs[i].rank,
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &in_values[i]));
  }
  ORT_CHECK(g_ort->Run(session, NULL, input_names, (const OrtValue* const*)in_values, num_inputs,
                       output_names, num_outputs, out_values));
  for (size_t i = 0; i < num_outputs; ++i) {
    EXPECT(out_values[i] != NULL, "Run gave no value for output %s", output_names[i]);
    OrtTensorTypeAndShapeInfo* info = NULL;
    ORT_CHECK(g_ort->GetTensorTypeAndShape(out_values[i], &info));
    ONNXTensorElementDataType type;
    ORT_CHECK(g_ort->GetTensorElementType(info, &type));
    EXPECT(type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "output %s has element type %d",
           output_names[i], (int)type);
    Tensor t;
    memset(&t, 0, sizeof t);
    ORT_CHECK(g_ort->GetDimensionsCount(info, &t.rank));
    EXPECT(t.rank <= MAX_RANK, "output %s has rank %zu", output_names[i], t.rank);
    ORT_CHECK(g_ort->GetDimensions(info, t.shape, t.rank));
    ORT_CHECK(g_ort->GetTensorShapeElementCount(info, &t.count));
    g_ort->ReleaseTensorTypeAndShapeInfo(info);
    void* data = NULL;
    ORT_CHECK(g_ort->GetTensorMutableData(out_values[i], &data));
    t.data = malloc((t.count ? t.count : 1) * sizeof(float));
    EXPECT(t.data != NULL, "out of memory");
    if (t.count) {
      EXPECT(data != NULL, "output %s has no data", output_names[i]);
      memcpy(t.data, data, t.count * sizeof(float));
    }
    outputs[i] = t;
    g_ort->ReleaseValue(out_values[i]);
  }
  for (size_t i = 0; i < num_inputs; ++i) g_ort->ReleaseValue(in_values[i]);
  g_ort->ReleaseMemoryInfo(mem);
}

static void format_shape(const Tensor* t, char* buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (size_t i = 0; i < t->rank && used < size; ++i)
    used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? "," : "",
                             (long long)t->shape[i]);
  if (used < size) snprintf(buf + used, size - used, "]");
}

double expect_close(const char* what, const Tensor* got, const Tensor* want) {
  char gs[128], ws[128];
  format_shape(got, gs, sizeof gs);
  format_shape(want, ws, sizeof ws);
  EXPECT(got->rank == want->rank && got->count == want->count &&
             memcmp(got->shape, want->shape, got->rank * sizeof(int64_t)) == 0,
         "%s: kiln shape %s vs CPU EP shape %s", what, gs, ws);
  double max_diff = 0.0;
  for (size_t i = 0; i < got->count; ++i) {
    double g = got->data[i], w = want->data[i];
    double diff = fabs(g - w);
    double tol = 1e-6 + 1e-5 * fabs(w);
    EXPECT(!isnan(g) && !isnan(w) && diff <= tol,
           "%s: element %zu: kiln %.9g vs CPU EP %.9g (|diff| %.3g > tolerance %.3g)", what, i, g,
           w, diff, tol);
    if (diff > max_diff) max_diff = diff;
  }
  return max_diff;
}

char* path_join(const char* dir, const char* name) {
  size_t n = strlen(dir) + 1 + strlen(name) + 1;
  char* p = malloc(n);
  EXPECT(p != NULL, "out of memory");
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

void compile_to_file(OrtEnv* env, const OrtEpDevice* device, const char* input, const char* output,
                     uint32_t flags, int share, int stop) {
  const OrtCompileApi* compile = g_ort->GetCompileApi();
  EXPECT(compile != NULL, "ORT has no compile API");
  OrtSessionOptions* so = NULL;
  ORT_CHECK(g_ort->CreateSessionOptions(&so));
  if (share) ORT_CHECK(g_ort->AddSessionConfigEntry(so, "ep.share_ep_contexts", "1"));
  if (stop) ORT_CHECK(g_ort->AddSessionConfigEntry(so, "ep.stop_share_ep_contexts", "1"));
  const char* claim_key[1] = {"claim"};
  const char* claim_all[1] = {"all"}; /* the harness's toy graphs, see create_session */
  ORT_CHECK(g_ort->SessionOptionsAppendExecutionProvider_V2(so, env, &device, 1, claim_key, claim_all, 1));
  OrtModelCompilationOptions* co = NULL;
  ORT_CHECK(compile->CreateModelCompilationOptionsFromSessionOptions(env, so, &co));
  ORT_CHECK(compile->ModelCompilationOptions_SetInputModelPath(co, input));
  ORT_CHECK(compile->ModelCompilationOptions_SetOutputModelPath(co, output));
  ORT_CHECK(compile->ModelCompilationOptions_SetEpContextEmbedMode(co, false));
  ORT_CHECK(compile->ModelCompilationOptions_SetFlags(co, flags));
  ORT_CHECK(compile->CompileModel(env, co));
  compile->ReleaseModelCompilationOptions(co);
  g_ort->ReleaseSessionOptions(so);
}
