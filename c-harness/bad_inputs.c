/*
 * bad_inputs.c — the bad input table through the C API: a C application
 * loading broken compiled models with kiln gets an OrtStatus with the right
 * OrtErrorCode and a message naming the cause, never a crash or a hang, and
 * nothing is written next to the model.
 *
 *   bad_inputs <path to libkiln_ep.so> <models dir> <work dir>
 *
 * Compiles models/add_mul_relu.onnx once (OrtCompileApi, embed mode 0), then
 * for every row copies the compiled model and its binary into
 * <work dir>/row<N>/inner/, breaks one thing, creates a session (CPU fallback
 * off) and checks the status. Attributes of the compiled model are edited in
 * its serialized bytes with same-length substitutions located by the
 * attribute's protobuf field (name, then value tag), so the file stays a
 * valid ONNX model. One row per category of python/tests/test_bad_inputs.py.
 * Each session creation runs under alarm(): a hang kills the program (and
 * fails the test) instead of blocking it.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define HANG_GUARD_SECONDS 120

typedef struct Buf {
  unsigned char* data;
  size_t len;
} Buf;

static Buf read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) die("open %s: %s", path, strerror(errno));
  Buf b = {NULL, 0};
  size_t cap = 0;
  for (;;) {
    if (b.len == cap) {
      cap = cap ? cap * 2 : 4096;
      b.data = realloc(b.data, cap);
      if (!b.data) die("out of memory");
    }
    size_t n = fread(b.data + b.len, 1, cap - b.len, f);
    b.len += n;
    if (n == 0) break;
  }
  fclose(f);
  return b;
}

static void write_file(const char* path, const unsigned char* data, size_t len) {
  FILE* f = fopen(path, "wb");
  if (!f) die("create %s: %s", path, strerror(errno));
  if (len && fwrite(data, 1, len, f) != len) die("write %s", path);
  if (fclose(f) != 0) die("close %s", path);
}

/* The value bytes of the first protobuf field `name` (a string field with
 * tag 0x0a) followed by the value tag `tag`: for a STRING attribute (tag
 * 0x22) the string's first byte, for an INT (tag 0x18) the varint's. */
static unsigned char* find_value(Buf* b, const char* name, unsigned char tag) {
  size_t n = strlen(name);
  for (size_t i = 0; i + n + 4 < b->len; ++i) {
    if (b->data[i] == 0x0a && b->data[i + 1] == n && memcmp(b->data + i + 2, name, n) == 0 &&
        b->data[i + 2 + n] == tag) {
      return b->data + i + 3 + n + (tag == 0x22 ? 1 : 0);
    }
  }
  die("field '%s' with value tag 0x%02x not found in the compiled model", name, tag);
}

/* Replaces a STRING attribute's value by `text`, which must be as long. */
static void set_string(Buf* b, const char* attr, const char* text) {
  unsigned char* v = find_value(b, attr, 0x22);
  if ((size_t)v[-1] != strlen(text)) die("'%s' is %u bytes, '%s' is not", attr, v[-1], text);
  memcpy(v, text, strlen(text));
}

/* Replaces `from` by `to` (same length) at its first occurrence. */
static void replace_bytes(Buf* b, const char* from, const char* to) {
  size_t n = strlen(from);
  for (size_t i = 0; i + n <= b->len; ++i) {
    if (memcmp(b->data + i, from, n) == 0) {
      memcpy(b->data + i, to, n);
      return;
    }
  }
  die("'%s' not found in the compiled model", from);
}

/* The folder's entries as one sorted, newline-separated string (malloc'ed). */
static int cmp_str(const void* a, const void* b) {
  return strcmp(*(const char* const*)a, *(const char* const*)b);
}

static char* listing(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) die("opendir %s: %s", dir, strerror(errno));
  char* names[64];
  size_t n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && n < 64) {
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof names[0], cmp_str);
  size_t total = 1;
  for (size_t i = 0; i < n; ++i) total += strlen(names[i]) + 1;
  char* out = calloc(total, 1);
  for (size_t i = 0; i < n; ++i) {
    strcat(out, names[i]);
    strcat(out, "\n");
    free(names[i]);
  }
  return out;
}

/* ---- the rows ----------------------------------------------------------- */

typedef struct Row Row;
typedef void (*Breaker)(const Row* row, Buf* ctx, Buf* bin, const char* inner, const char* bin_path);

struct Row {
  const char* id;
  Breaker breaker;
  OrtErrorCode code;
  /* ORT_FAIL rows from CreateEp: kiln's INVALID_ARGUMENT wrapped by ORT */
  int create_ep;
  const char* needle;
  Option option; /* an EP option for the session, if key is set */
};

static void truncated(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)i, (void)p;
  b->len /= 2;
}
static void flipped(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)i, (void)p;
  b->data[b->len / 2] ^= 0x10;
}
static void foreign(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)i, (void)p;
  memset(b->data, 'x', b->len);
}
static void empty(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)i, (void)p;
  b->len = 0;
}
/* Special files replace the binary after it was written (see main). */
static void directory(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)b, (void)i;
  if (unlink(p) != 0 || mkdir(p, 0700) != 0) die("mkdir %s: %s", p, strerror(errno));
}
static void fifo(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)b, (void)i;
  if (unlink(p) != 0 || mkfifo(p, 0600) != 0) die("mkfifo %s: %s", p, strerror(errno));
}
static void symlink_outside(const Row* r, Buf* c, Buf* b, const char* inner, const char* p) {
  (void)r, (void)c, (void)b;
  char* outside = path_join(inner, "../outside.bin");
  if (rename(p, outside) != 0 || symlink(outside, p) != 0) die("symlink %s: %s", p, strerror(errno));
  free(outside);
}
static void embed_mode_2(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  *find_value(c, "embed_mode", 0x18) = 2;
}
static void partition_renamed(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  *find_value(c, "partition_name", 0x22) = 'X';
}
static void dotdot_path(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  set_string(c, "ep_cache_context", "../add_mul_relu_k.bin");
}
static void absolute_path(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  set_string(c, "ep_cache_context", "/add_mul_relu_kil.bin");
}
static void wrong_source(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  set_string(c, "source", "OtherExecutionProvide");
}
/* Graph output Y (ValueInfoProto: name, then type) re-typed float -> bool. */
static void output_to_bool(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  unsigned char* t = find_value(c, "Y", 0x12); /* type length, tensor_type tag, length */
  if (t[1] != 0x0a || t[3] != 0x08 || t[4] != 1) die("output Y's type is not laid out as expected");
  t[4] = 9; /* TensorProto.BOOL */
}
static void compat_format(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)b, (void)i, (void)p;
  replace_bytes(c, "kiln;format=13;", "kiln;format=14;"); /* 13: context::FORMAT_VERSION */
}
static void nothing(const Row* r, Buf* c, Buf* b, const char* i, const char* p) {
  (void)r, (void)c, (void)b, (void)i, (void)p;
}

static const Row ROWS[] = {
    {"truncated binary", truncated, ORT_INVALID_GRAPH, 0, "truncated", {NULL, NULL}},
    {"bit-flipped binary", flipped, ORT_INVALID_GRAPH, 0, "checksum", {NULL, NULL}},
    {"foreign binary", foreign, ORT_INVALID_GRAPH, 0, "not a kiln context binary", {NULL, NULL}},
    {"empty binary", empty, ORT_INVALID_GRAPH, 0, "truncated", {NULL, NULL}},
    {"directory as binary", directory, ORT_INVALID_GRAPH, 0, "a directory", {NULL, NULL}},
    {"FIFO as binary", fifo, ORT_INVALID_GRAPH, 0, "FIFO", {NULL, NULL}},
    {"FIFO as binary, copy storage", fifo, ORT_INVALID_GRAPH, 0, "FIFO", {"context_storage", "copy"}},
    {"binary symlinked outside the folder", symlink_outside, ORT_INVALID_GRAPH, 0, "symbolic link", {NULL, NULL}},
    {"embed_mode 2", embed_mode_2, ORT_INVALID_GRAPH, 0, "embed_mode 2 is not 0 or 1", {NULL, NULL}},
    {"partition_name not in binary", partition_renamed, ORT_INVALID_GRAPH, 0, "is not in its context binary",
     {NULL, NULL}},
    {"'..' in ep_cache_context", dotdot_path, ORT_INVALID_GRAPH, 0, "contains '..'", {NULL, NULL}},
    {"absolute ep_cache_context", absolute_path, ORT_INVALID_GRAPH, 0, "is an absolute path", {NULL, NULL}},
    {"wrong source", wrong_source, ORT_NOT_IMPLEMENTED, 0, "OtherExecutionProvide", {NULL, NULL}},
    {"output re-typed float -> bool", output_to_bool, ORT_INVALID_GRAPH, 0, "found bool [2, 3, 4], expected float",
     {NULL, NULL}},
    {"tampered ep_compatibility_info", compat_format, ORT_FAIL, 0, "not supported", {NULL, NULL}},
    {"bad option value", nothing, ORT_FAIL, 1, "invalid value 'mmap' for kiln option 'context_storage'",
     {"context_storage", "mmap"}},
    {"unknown option", nothing, ORT_FAIL, 1, "unknown kiln option 'speed'", {"speed", "fast"}},
};

static int run_row(OrtEnv* env, const OrtEpDevice* device, const Row* row, size_t index, const char* work,
                   const Buf* good_ctx, const Buf* good_bin) {
  char name[32];
  snprintf(name, sizeof name, "row%zu", index);
  char* root = path_join(work, name);
  char* inner = path_join(root, "inner");
  if (mkdir(root, 0700) != 0 || mkdir(inner, 0700) != 0) die("mkdir %s: %s", inner, strerror(errno));
  char* ctx_path = path_join(inner, "amr_ctx.onnx");
  char* bin_path = path_join(inner, "add_mul_relu_kiln.bin");
  Buf ctx = {malloc(good_ctx->len), good_ctx->len};
  Buf bin = {malloc(good_bin->len), good_bin->len};
  memcpy(ctx.data, good_ctx->data, ctx.len);
  memcpy(bin.data, good_bin->data, bin.len);
  int special = row->breaker == directory || row->breaker == fifo || row->breaker == symlink_outside;
  if (!special) row->breaker(row, &ctx, &bin, inner, bin_path);
  write_file(ctx_path, ctx.data, ctx.len);
  write_file(bin_path, bin.data, bin.len);
  if (special) row->breaker(row, &ctx, &bin, inner, bin_path);
  char* before_inner = listing(inner);
  char* before_root = listing(root);

  OrtStatus* status = NULL;
  /* A node kiln does not claim is left to ORT, which has no kernel for it:
   * with the CPU fallback disabled ORT refuses earlier, with its own FAIL. */
  int no_fallback = row->code != ORT_NOT_IMPLEMENTED;
  alarm(HANG_GUARD_SECONDS);
  OrtSession* session = create_session(env, ctx_path, device, row->option.key ? &row->option : NULL,
                                       row->option.key ? 1 : 0, no_fallback, &status);
  alarm(0);
  int ok = 1;
  if (session) {
    fprintf(stderr, "FAIL [%s]: the session was created\n", row->id);
    g_ort->ReleaseSession(session);
    ok = 0;
  } else {
    OrtErrorCode code = g_ort->GetErrorCode(status);
    const char* message = g_ort->GetErrorMessage(status);
    const char* form = NULL;
    if (code != row->code) {
      fprintf(stderr, "FAIL [%s]: code %d, want %d: %s\n", row->id, (int)code, (int)row->code, message);
      ok = 0;
    } else if (row->create_ep && !is_invalid_argument(status, &form)) {
      fprintf(stderr, "FAIL [%s]: not kiln's INVALID_ARGUMENT from CreateEp: %s\n", row->id, message);
      ok = 0;
    } else if (!strstr(message, row->needle)) {
      fprintf(stderr, "FAIL [%s]: '%s' not in the message: %s\n", row->id, row->needle, message);
      ok = 0;
    } else if (row->code == ORT_INVALID_GRAPH && !strstr(message, "kiln EPContext node")) {
      fprintf(stderr, "FAIL [%s]: the message does not name kiln's node: %s\n", row->id, message);
      ok = 0;
    } else {
      printf("ok   %-40s code %d: %.160s\n", row->id, (int)code, message);
    }
    g_ort->ReleaseStatus(status);
  }
  char* after_inner = listing(inner);
  char* after_root = listing(root);
  if (strcmp(before_inner, after_inner) || strcmp(before_root, after_root)) {
    fprintf(stderr, "FAIL [%s]: files changed:\n%s%s-> \n%s%s", row->id, before_root, before_inner, after_root,
            after_inner);
    ok = 0;
  }
  free(before_inner), free(before_root), free(after_inner), free(after_root);
  free(ctx.data), free(bin.data);
  free(ctx_path), free(bin_path), free(inner), free(root);
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir> <work dir>\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  const char* work = argv[3];
  char* original = path_join(argv[2], "add_mul_relu.onnx");
  char* good_dir = path_join(work, "good");
  if (mkdir(good_dir, 0700) != 0) die("mkdir %s: %s", good_dir, strerror(errno));
  char* good_ctx_path = path_join(good_dir, "amr_ctx.onnx");
  char* good_bin_path = path_join(good_dir, "add_mul_relu_kiln.bin");

  harness_init();
  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_FATAL, "kiln-c-harness", &env));
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, "kiln", kiln_path));
  DeviceInfo devs[8];
  EXPECT(kiln_devices(env, devs, 8) == 1, "want exactly one kiln device");
  compile_to_file(env, devs[0].device, original, good_ctx_path, OrtCompileApiFlags_ERROR_IF_NO_NODES_COMPILED, 0,
                  0);
  Buf good_ctx = read_file(good_ctx_path);
  Buf good_bin = read_file(good_bin_path);

  /* the unbroken model loads: every failure below is the row's doing */
  OrtSession* good = create_session(env, good_ctx_path, devs[0].device, NULL, 0, 1, NULL);
  g_ort->ReleaseSession(good);

  size_t rows = sizeof ROWS / sizeof ROWS[0];
  size_t passed = 0;
  for (size_t i = 0; i < rows; ++i) passed += run_row(env, devs[0].device, &ROWS[i], i, work, &good_ctx, &good_bin);

  ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, "kiln"));
  g_ort->ReleaseEnv(env);
  free(good_ctx.data), free(good_bin.data);
  free(original), free(good_dir), free(good_ctx_path), free(good_bin_path);
  if (passed != rows) die("%zu of %zu bad-input rows failed", rows - passed, rows);
  printf("OK: %zu bad-input rows refused with the expected code and message, no files left behind\n", rows);
  return 0;
}
