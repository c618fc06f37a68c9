/*
 * run_model.c — what a C application does with kiln:
 *
 *   run_model <path to libkiln_ep.so> <models dir>
 *
 * Links ONNX Runtime 1.31.1, registers kiln, picks kiln's host CPU device,
 * runs models/add_mul_relu.onnx on kiln (CPU fallback disabled) and
 * models/split.onnx (kiln + CPU EP), compares every output with ORT's own
 * CPU EP on the same inputs, checks kiln_ep_stats() proves kiln compiled and
 * ran the partitions, checks a bad EP option fails session creation with
 * INVALID_ARGUMENT naming the option, then releases everything and
 * unregisters kiln.
 *
 * Exit status 0 and a summary on stdout on success; "FAIL: ..." on stderr
 * and exit status 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define REGISTRATION_NAME "kiln"

static const int64_t SHAPE_2x3x4[3] = {2, 3, 4};

/* Runs both sessions on the same inputs, compares; returns the max |diff|. */
static double compare_with_cpu(OrtSession* kiln, OrtSession* cpu, const char* model,
                               const char* const* in_names, const Tensor* inputs, size_t n_in,
                               const char* const* out_names, size_t n_out) {
  Tensor got[4], want[4];
  run_session(kiln, in_names, inputs, n_in, out_names, got, n_out);
  run_session(cpu, in_names, inputs, n_in, out_names, want, n_out);
  double max_diff = 0.0;
  for (size_t i = 0; i < n_out; ++i) {
    char what[128];
    snprintf(what, sizeof what, "%s output %s", model, out_names[i]);
    double d = expect_close(what, &got[i], &want[i]);
    if (d > max_diff) max_diff = d;
    tensor_free(&got[i]);
    tensor_free(&want[i]);
  }
  return max_diff;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir>\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  const char* models = argv[2];
  char* add_mul_relu = path_join(models, "add_mul_relu.onnx");
  char* split = path_join(models, "split.onnx");

  harness_init();
  void* kiln_handle = NULL;
  kiln_ep_stats_fn stats = load_kiln_stats(kiln_path, &kiln_handle);

  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-harness", &env));

  /* ---- register kiln and find its host device ------------------------- */
  DeviceInfo devs[8];
  EXPECT(kiln_devices(env, devs, 8) == 0, "kiln devices listed before registration");
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, REGISTRATION_NAME, kiln_path));
  print_devices(env);
  size_t n_kiln = kiln_devices(env, devs, 8);
  EXPECT(n_kiln == 1, "kiln (registered as '%s') offers %zu devices, want exactly 1 host device",
         REGISTRATION_NAME, n_kiln);
  DeviceInfo host = devs[0];
  EXPECT(!host.is_virtual, "kiln's only device is virtual under a plain registration name");
  EXPECT(host.ep_vendor && strcmp(host.ep_vendor, KILN_VENDOR) == 0, "EP vendor '%s'",
         host.ep_vendor ? host.ep_vendor : "(null)");
  EXPECT(host.hw_type == OrtHardwareDeviceType_CPU, "hardware device type %d",
         (int)host.hw_type);
  EXPECT(host.target && host.target[0], "EP metadata kiln.target missing or empty");
  EXPECT(host.opt_target && strcmp(host.opt_target, host.target) == 0,
         "EP option target '%s' differs from kiln.target '%s'",
         host.opt_target ? host.opt_target : "(missing)", host.target);
  EXPECT(host.opt_disabled_ops != NULL, "EP option disabled_ops missing");
  /* The device's strings are ORT's and go away with the registration. */
  char* host_target = strdup(host.target);
  EXPECT(host_target != NULL, "out of memory");
  printf("kiln host device: target %s\n", host_target);

  /* ---- add_mul_relu.onnx: one partition, CPU fallback disabled -------- */
  KilnStats s0 = stats();
  print_stats("before add_mul_relu:", s0);
  OrtSession* kiln = create_session(env, add_mul_relu, host.device, NULL, 0, 1, NULL);
  KilnStats s1 = stats();
  print_stats("after session:", s1);
  EXPECT(s1.eps_created - s0.eps_created == 1, "eps_created rose by %llu, want 1",
         (unsigned long long)(s1.eps_created - s0.eps_created));
  EXPECT(s1.partitions_compiled - s0.partitions_compiled == 1,
         "partitions_compiled rose by %llu, want 1 (add_mul_relu is one partition)",
         (unsigned long long)(s1.partitions_compiled - s0.partitions_compiled));
  EXPECT(s1.nodes_compiled - s0.nodes_compiled == 3, "nodes_compiled rose by %llu, want 3",
         (unsigned long long)(s1.nodes_compiled - s0.nodes_compiled));
  EXPECT(s1.compute_calls == s0.compute_calls, "compute calls before any Run");

  OrtSession* cpu = create_session(env, add_mul_relu, NULL, NULL, 0, 0, NULL);
  const char* amr_in[2] = {"A", "B"};
  const char* amr_out[1] = {"Y"};
  Tensor ab[2] = {tensor_pattern(SHAPE_2x3x4, 3, 1), tensor_pattern(SHAPE_2x3x4, 3, 2)};
  double amr_diff = compare_with_cpu(kiln, cpu, "add_mul_relu.onnx", amr_in, ab, 2, amr_out, 1);
  {
    /* Relu must have done something: some outputs positive, some zero. */
    Tensor y;
    run_session(kiln, amr_in, ab, 2, amr_out, &y, 1);
    size_t pos = 0, zero = 0;
    for (size_t i = 0; i < y.count; ++i) {
      pos += y.data[i] > 0.0f;
      zero += y.data[i] == 0.0f;
    }
    EXPECT(pos > 0 && zero > 0 && pos + zero == y.count,
           "Relu output has %zu positive and %zu zero of %zu elements", pos, zero, y.count);
    tensor_free(&y);
  }
  KilnStats s2 = stats();
  print_stats("after 2 runs:", s2);
  EXPECT(s2.compute_calls - s1.compute_calls == 2, "compute_calls rose by %llu over 2 runs, want 2",
         (unsigned long long)(s2.compute_calls - s1.compute_calls));
  EXPECT(s2.partitions_compiled == s1.partitions_compiled, "Run compiled partitions again");
  for (int i = 0; i < 2; ++i) tensor_free(&ab[i]);
  g_ort->ReleaseSession(kiln);
  g_ort->ReleaseSession(cpu);
  printf("add_mul_relu.onnx: kiln matches CPU EP (max |diff| %.3g)\n", amr_diff);

  /* ---- split.onnx: unsupported Atan/Asinh split kiln's partitions ------ */
  Option explicit_target[1] = {{"target", host.target}};
  kiln = create_session(env, split, host.device, explicit_target, 1, 0, NULL);
  KilnStats s3 = stats();
  print_stats("after split session:", s3);
  uint64_t split_parts = s3.partitions_compiled - s2.partitions_compiled;
  EXPECT(split_parts >= 2, "split.onnx compiled %llu kiln partitions, want several",
         (unsigned long long)split_parts);
  cpu = create_session(env, split, NULL, NULL, 0, 0, NULL);
  const char* split_in[1] = {"X"};
  const char* split_out[2] = {"Y", "Z"};
  Tensor x = tensor_pattern(SHAPE_2x3x4, 3, 3);
  double split_diff = compare_with_cpu(kiln, cpu, "split.onnx", split_in, &x, 1, split_out, 2);
  tensor_free(&x);
  KilnStats s4 = stats();
  print_stats("after split run:", s4);
  EXPECT(s4.compute_calls - s3.compute_calls == split_parts,
         "one split.onnx run made %llu kiln compute calls, want one per partition (%llu)",
         (unsigned long long)(s4.compute_calls - s3.compute_calls),
         (unsigned long long)split_parts);
  g_ort->ReleaseSession(kiln);
  g_ort->ReleaseSession(cpu);
  printf("split.onnx: %llu kiln partitions (%llu nodes), kiln matches CPU EP (max |diff| %.3g)\n",
         (unsigned long long)split_parts,
         (unsigned long long)(s3.nodes_compiled - s2.nodes_compiled), split_diff);

  /* ---- a bad EP option is INVALID_ARGUMENT naming the option --------- */
  Option bogus[1] = {{"target", "bogus"}};
  OrtStatus* error = NULL;
  OrtSession* bad = create_session(env, add_mul_relu, host.device, bogus, 1, 0, &error);
  EXPECT(bad == NULL && error != NULL, "a session with target=bogus was created");
  OrtErrorCode code = g_ort->GetErrorCode(error);
  const char* message = g_ort->GetErrorMessage(error);
  message = message ? message : "";
  /* ORT 1.31.1 wraps kiln's INVALID_ARGUMENT in ORT_FAIL: see is_invalid_argument. */
  const char* form = NULL;
  EXPECT(is_invalid_argument(error, &form),
         "target=bogus gave ORT error %d, want %d (or %d wrapping INVALID_ARGUMENT): %s",
         (int)code, (int)ORT_INVALID_ARGUMENT, (int)ORT_FAIL, message);
  EXPECT(strstr(message, "target") != NULL && strstr(message, "bogus") != NULL,
         "error message names neither option nor value: %s", message);
  printf("target=bogus: %s: %s\n", form, message);
  g_ort->ReleaseStatus(error);

  /* ---- unregister and clean up --------------------------------------- */
  ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, REGISTRATION_NAME));
  EXPECT(kiln_devices(env, devs, 8) == 0, "kiln devices listed after unregistration");
  g_ort->ReleaseEnv(env);
  KilnStats end = stats();
  print_stats("at the end:", end);
  dlclose(kiln_handle);
  free(add_mul_relu);
  free(split);
  printf("OK: kiln (%s) ran add_mul_relu.onnx and split.onnx, matching the CPU EP\n",
         host_target);
  free(host_target);
  return 0;
}
