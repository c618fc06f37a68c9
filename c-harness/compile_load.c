/*
 * compile_load.c — compile once, load many: a C application compiling a
 * model for kiln through OrtCompileApi, then loading the compiled model.
 *
 *   compile_load <path to libkiln_ep.so> <models dir> <work dir>
 *
 * Compiles models/add_mul_relu.onnx to <work dir>/amr_ctx.onnx with embed
 * mode 0 (so kiln writes <work dir>/add_mul_relu_kiln.bin), then creates a
 * session on the compiled model with CPU fallback disabled, checks that
 * kiln loaded the graph instead of compiling it (kiln_ep_stats), and
 * compares the output with ORT's CPU EP on the original model.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

static const int64_t SHAPE_2x3x4[3] = {2, 3, 4};

static int file_exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_size > 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir> <work dir>\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  char* original = path_join(argv[2], "add_mul_relu.onnx");
  char* compiled = path_join(argv[3], "amr_ctx.onnx");
  char* binary = path_join(argv[3], "add_mul_relu_kiln.bin");

  harness_init();
  void* kiln_handle = NULL;
  kiln_ep_stats_fn stats = load_kiln_stats(kiln_path, &kiln_handle);
  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-harness", &env));
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, "kiln", kiln_path));
  DeviceInfo devs[8];
  EXPECT(kiln_devices(env, devs, 8) == 1, "want exactly one kiln device");

  KilnStats s0 = stats();
  compile_to_file(env, devs[0].device, original, compiled, OrtCompileApiFlags_ERROR_IF_NO_NODES_COMPILED, 0, 0);
  KilnStats s1 = stats();
  EXPECT(file_exists(compiled), "compiled model %s missing", compiled);
  EXPECT(file_exists(binary), "context binary %s missing", binary);
  EXPECT(s1.partitions_compiled - s0.partitions_compiled == 1, "compiling compiled %llu partitions",
         (unsigned long long)(s1.partitions_compiled - s0.partitions_compiled));
  EXPECT(s1.compute_calls == s0.compute_calls, "the compile API ran the model");
  printf("compiled %s -> %s + %s\n", original, compiled, binary);

  OrtSession* kiln = create_session(env, compiled, devs[0].device, NULL, 0, 1, NULL);
  KilnStats s2 = stats();
  EXPECT(s2.partitions_compiled == s1.partitions_compiled, "loading the compiled model compiled again");
  EXPECT(s2.context_graphs_loaded - s1.context_graphs_loaded == 1, "loaded %llu graphs, want 1",
         (unsigned long long)(s2.context_graphs_loaded - s1.context_graphs_loaded));
  EXPECT(s2.context_files_opened - s1.context_files_opened == 1, "opened %llu binaries, want 1",
         (unsigned long long)(s2.context_files_opened - s1.context_files_opened));

  OrtSession* cpu = create_session(env, original, NULL, NULL, 0, 0, NULL);
  const char* in_names[2] = {"A", "B"};
  const char* out_names[1] = {"Y"};
  Tensor ab[2] = {tensor_pattern(SHAPE_2x3x4, 3, 1), tensor_pattern(SHAPE_2x3x4, 3, 2)};
  Tensor got, want;
  run_session(kiln, in_names, ab, 2, out_names, &got, 1);
  run_session(cpu, in_names, ab, 2, out_names, &want, 1);
  double diff = expect_close("amr_ctx.onnx output Y", &got, &want);
  tensor_free(&got);
  tensor_free(&want);
  for (int i = 0; i < 2; ++i) tensor_free(&ab[i]);

  g_ort->ReleaseSession(kiln);
  g_ort->ReleaseSession(cpu);
  ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, "kiln"));
  g_ort->ReleaseEnv(env);
  dlclose(kiln_handle);
  printf("OK: the compiled model loaded without compiling and matches the CPU EP (max |diff| %.3g)\n", diff);
  free(original);
  free(compiled);
  free(binary);
  return 0;
}
