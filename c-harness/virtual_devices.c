/*
 * virtual_devices.c — kiln's virtual devices, as a C application sees them:
 *
 *   virtual_devices <path to libkiln_ep.so> <models dir> [--expect-host <target>]
 *
 * Registers kiln under "kiln.virtual" (a name ending in ".virtual"), checks
 * that besides the host CPU device kiln offers one virtual device per other
 * target (hardware metadata is_virtual=1, vendor kiln, kiln.target in EP and
 * hardware metadata and as the default 'target' option, no target twice),
 * then tries models/add_mul_relu.onnx on every kiln device: a target the host
 * can run must match ORT's CPU EP, any other must fail with
 * INVALID_ARGUMENT "... cannot run on this host" (as ORT_FAIL wrapping it:
 * see is_invalid_argument). The host device and an
 * x86_64-generic device must run. With --expect-host (e.g. x86_64-generic
 * under KILN_MAX_TARGET=x86_64-generic), the host device must have that
 * target; for x86_64-generic every virtual device must then be refused.
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

#define REGISTRATION_NAME "kiln.virtual"
#define MAX_DEVICES 16

static const int64_t SHAPE_2x3x4[3] = {2, 3, 4};

static int same(const char* a, const char* b) { return a && b && strcmp(a, b) == 0; }

int main(int argc, char** argv) {
  const char* expect_host = NULL;
  if (argc == 5 && strcmp(argv[3], "--expect-host") == 0) {
    expect_host = argv[4];
  } else if (argc != 3) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir> [--expect-host <target>]\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  char* model = path_join(argv[2], "add_mul_relu.onnx");

  harness_init();
  void* kiln_handle = NULL;
  kiln_ep_stats_fn stats = load_kiln_stats(kiln_path, &kiln_handle);

  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-harness-virtual", &env));
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, REGISTRATION_NAME, kiln_path));
  print_devices(env);

  DeviceInfo devs[MAX_DEVICES];
  size_t n = kiln_devices(env, devs, MAX_DEVICES);
  size_t hosts = 0, virtuals = 0;
  const DeviceInfo* host = NULL;
  for (size_t i = 0; i < n; ++i) {
    const DeviceInfo* d = &devs[i];
    EXPECT(same(d->ep_vendor, KILN_VENDOR), "device %zu: EP vendor '%s'", i,
           d->ep_vendor ? d->ep_vendor : "(null)");
    EXPECT(d->hw_type == OrtHardwareDeviceType_CPU, "device %zu: hardware type %d", i,
           (int)d->hw_type);
    EXPECT(d->target && d->target[0], "device %zu: EP metadata kiln.target missing", i);
    EXPECT(same(d->opt_target, d->target), "device %zu: EP option target '%s' vs kiln.target '%s'",
           i, d->opt_target ? d->opt_target : "(missing)", d->target);
    for (size_t j = 0; j < i; ++j)
      EXPECT(!same(devs[j].target, d->target), "devices %zu and %zu both target %s", j, i,
             d->target);
    if (d->is_virtual) {
      ++virtuals;
      EXPECT(same(d->hw_vendor, KILN_VENDOR), "virtual device %zu: hardware vendor '%s'", i,
             d->hw_vendor ? d->hw_vendor : "(null)");
      EXPECT(same(d->hw_target, d->target),
             "virtual device %zu: hardware metadata kiln.target '%s' vs EP metadata '%s'", i,
             d->hw_target ? d->hw_target : "(missing)", d->target);
    } else {
      ++hosts;
      host = d;
    }
  }
  EXPECT(hosts == 1, "registered as '%s', kiln offers %zu host devices, want 1", REGISTRATION_NAME,
         hosts);
  EXPECT(virtuals >= 1, "registered as '%s', kiln offers no virtual device", REGISTRATION_NAME);
  printf("kiln offers %zu devices: host %s and %zu virtual\n", n, host->target, virtuals);
  if (expect_host != NULL)
    EXPECT(same(host->target, expect_host), "host device targets %s, want %s", host->target,
           expect_host);

  /* Reference output from ORT's CPU EP. */
  const char* in_names[2] = {"A", "B"};
  const char* out_names[1] = {"Y"};
  Tensor ab[2] = {tensor_pattern(SHAPE_2x3x4, 3, 1), tensor_pattern(SHAPE_2x3x4, 3, 2)};
  Tensor want;
  OrtSession* cpu = create_session(env, model, NULL, NULL, 0, 0, NULL);
  run_session(cpu, in_names, ab, 2, out_names, &want, 1);
  g_ort->ReleaseSession(cpu);

  size_t ran = 0, refused = 0;
  int generic_seen = 0;
  for (size_t i = 0; i < n; ++i) {
    const DeviceInfo* d = &devs[i];
    int is_generic = same(d->target, "x86_64-generic");
    generic_seen |= is_generic;
    KilnStats before = stats();
    OrtStatus* error = NULL;
    OrtSession* s = create_session(env, model, d->device, NULL, 0, 1, &error);
    if (s != NULL) {
      Tensor got;
      run_session(s, in_names, ab, 2, out_names, &got, 1);
      char what[128];
      snprintf(what, sizeof what, "add_mul_relu.onnx on %s device %s",
               d->is_virtual ? "virtual" : "host", d->target);
      double diff = expect_close(what, &got, &want);
      tensor_free(&got);
      g_ort->ReleaseSession(s);
      KilnStats after = stats();
      EXPECT(after.partitions_compiled - before.partitions_compiled == 1 &&
                 after.compute_calls - before.compute_calls == 1,
             "%s: kiln compiled %llu partitions and ran %llu, want 1 and 1", what,
             (unsigned long long)(after.partitions_compiled - before.partitions_compiled),
             (unsigned long long)(after.compute_calls - before.compute_calls));
      printf("  %-16s %-8s runs here, matches CPU EP (max |diff| %.3g)\n", d->target,
             d->is_virtual ? "virtual" : "host", diff);
      ++ran;
    } else {
      OrtErrorCode code = g_ort->GetErrorCode(error);
      const char* message = g_ort->GetErrorMessage(error);
      message = message ? message : "";
      EXPECT(d->is_virtual, "host device %s cannot run add_mul_relu.onnx: ORT error %d: %s",
             d->target, (int)code, message);
      EXPECT(!is_generic, "x86_64-generic device refused: ORT error %d: %s", (int)code, message);
      const char* form = NULL;
      EXPECT(is_invalid_argument(error, &form) && strstr(message, "cannot run on this host") != NULL,
             "virtual device %s: session failed with ORT error %d, want INVALID_ARGUMENT "
             "'... cannot run on this host': %s",
             d->target, (int)code, message);
      printf("  %-16s %-8s compile-only here (%s): %s\n", d->target, "virtual", form, message);
      g_ort->ReleaseStatus(error);
      ++refused;
    }
  }
  EXPECT(generic_seen, "no kiln device targets x86_64-generic");
  if (same(expect_host, "x86_64-generic"))
    EXPECT(refused == virtuals, "host capped at x86_64-generic, yet %zu of %zu virtual devices ran",
           virtuals - refused, virtuals);
  tensor_free(&want);
  for (int i = 0; i < 2; ++i) tensor_free(&ab[i]);

  ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, REGISTRATION_NAME));
  EXPECT(kiln_devices(env, devs, MAX_DEVICES) == 0, "kiln devices listed after unregistration");
  g_ort->ReleaseEnv(env);
  dlclose(kiln_handle);
  free(model);
  printf("OK: '%s' offered %zu virtual device(s); %zu device(s) ran, %zu refused as above the host\n",
         REGISTRATION_NAME, virtuals, ran, refused);
  return 0;
}
