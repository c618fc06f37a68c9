/*
 * share_compile.c — weight sharing from C: two models that share a backbone
 * compiled through OrtCompileApi as one ep.share_ep_contexts group, then
 * loaded by two sessions that share the binary.
 *
 *   share_compile <path to libkiln_ep.so> <models dir> <work dir>
 *
 * Compiles models/share_a.onnx and models/share_b.onnx into <work dir>
 * (share_a_ctx.onnx, share_b_ctx.onnx and ONE share_a_kiln.bin), checks the
 * binary holds the shared weights once, loads both compiled models with
 * ep.share_ep_contexts=1 (the binary is opened once), and compares each with
 * ORT's CPU EP on its original model.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

static const int64_t SHAPE_X[3] = {4, 64, 64};
/* One 64x64 float weight. */
#define WEIGHT_BYTES (64 * 64 * 4)

static long file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static size_t count_files(const char* dir) {
  DIR* d = opendir(dir);
  EXPECT(d != NULL, "cannot open %s", dir);
  size_t n = 0;
  for (struct dirent* e = readdir(d); e != NULL; e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

static OrtSessionOptions* kiln_options(OrtEnv* env, const OrtEpDevice* device, int last) {
  OrtSessionOptions* so = NULL;
  ORT_CHECK(g_ort->CreateSessionOptions(&so));
  ORT_CHECK(g_ort->AddSessionConfigEntry(so, "ep.share_ep_contexts", "1"));
  if (last) ORT_CHECK(g_ort->AddSessionConfigEntry(so, "ep.stop_share_ep_contexts", "1"));
  ORT_CHECK(g_ort->SessionOptionsAppendExecutionProvider_V2(so, env, &device, 1, NULL, NULL, 0));
  return so;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir> <work dir>\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  const char* work = argv[3];
  char* src[2] = {path_join(argv[2], "share_a.onnx"), path_join(argv[2], "share_b.onnx")};
  char* ctx[2] = {path_join(work, "share_a_ctx.onnx"), path_join(work, "share_b_ctx.onnx")};
  char* bin = path_join(work, "share_a_kiln.bin");

  harness_init();
  void* kiln_handle = NULL;
  kiln_ep_stats_fn stats = load_kiln_stats(kiln_path, &kiln_handle);
  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-harness", &env));
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, "kiln", kiln_path));
  DeviceInfo devs[8];
  EXPECT(kiln_devices(env, devs, 8) == 1, "want exactly one kiln device");

  /* ---- compile both models as one group -------------------------------- */
  compile_to_file(env, devs[0].device, src[0], ctx[0], 0, 1, 0);
  EXPECT(file_size(bin) < 0, "the binary exists before the group's stop session");
  compile_to_file(env, devs[0].device, src[1], ctx[1], 0, 1, 1);
  EXPECT(count_files(work) == 3, "%zu files in %s, want 2 models + 1 binary", count_files(work), work);
  long size = file_size(bin);
  /* backbone W and B once, two heads: 4 weights of 16 KiB stored, 6 referenced */
  EXPECT(size >= 4 * WEIGHT_BYTES && size < 5 * WEIGHT_BYTES, "binary is %ld bytes", size);
  printf("compiled 2 models into %s, %s and %s (%ld bytes)\n", ctx[0], ctx[1], bin, size);

  /* ---- load both, sharing the binary ------------------------------------ */
  KilnStats s0 = stats();
  OrtSession* sessions[2];
  for (int i = 0; i < 2; ++i) {
    OrtSessionOptions* so = kiln_options(env, devs[0].device, 0);
    ORT_CHECK(g_ort->AddSessionConfigEntry(so, "session.disable_cpu_ep_fallback", "1"));
    ORT_CHECK(g_ort->CreateSession(env, ctx[i], so, &sessions[i]));
    g_ort->ReleaseSessionOptions(so);
  }
  KilnStats s1 = stats();
  EXPECT(s1.context_files_opened - s0.context_files_opened == 1, "opened the binary %llu times",
         (unsigned long long)(s1.context_files_opened - s0.context_files_opened));
  EXPECT(s1.context_files_shared - s0.context_files_shared == 1, "shared it %llu times",
         (unsigned long long)(s1.context_files_shared - s0.context_files_shared));
  EXPECT(s1.partitions_compiled == s0.partitions_compiled, "loading compiled something");

  const char* in_names[1] = {"X"};
  const char* out_names[1] = {"Y"};
  Tensor x = tensor_pattern(SHAPE_X, 3, 11);
  double worst = 0.0;
  for (int i = 0; i < 2; ++i) {
    OrtSession* cpu = create_session(env, src[i], NULL, NULL, 0, 0, NULL);
    Tensor got, want;
    run_session(sessions[i], in_names, &x, 1, out_names, &got, 1);
    run_session(cpu, in_names, &x, 1, out_names, &want, 1);
    double d = expect_close(ctx[i], &got, &want);
    if (d > worst) worst = d;
    tensor_free(&got);
    tensor_free(&want);
    g_ort->ReleaseSession(cpu);
  }
  tensor_free(&x);
  /* Release in creation order: kiln must not care. */
  g_ort->ReleaseSession(sessions[0]);
  g_ort->ReleaseSession(sessions[1]);
  ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, "kiln"));
  g_ort->ReleaseEnv(env);
  dlclose(kiln_handle);
  printf("OK: both compiled models share one binary, loaded once, match the CPU EP (max |diff| %.3g)\n",
         worst);
  for (int i = 0; i < 2; ++i) {
    free(src[i]);
    free(ctx[i]);
  }
  free(bin);
  return 0;
}
