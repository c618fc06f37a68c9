/*
 * lifetime.c — kiln's newer ABI members and its lifetime, as a C application
 * meets them:
 *
 *   lifetime <path to libkiln_ep.so> <models dir>
 *
 * 1. Before ORT ever loaded kiln, ReleaseEpFactory(NULL) and a foreign
 *    pointer return (no status can exist yet) instead of aborting.
 * 2. ORT's GetHardwareDeviceEpIncompatibilityDetails reaches kiln's factory
 *    for every hardware device: a CPU gets no reason, anything else
 *    DEVICE_INCOMPATIBLE.
 * 3. A kiln session outlives UnregisterExecutionProviderLibrary: it still
 *    runs and matches the CPU EP; releasing it frees kiln's factory;
 *    registering kiln again works, 20 times over.
 * 4. Once loaded, ReleaseEpFactory(NULL) is ORT_INVALID_ARGUMENT.
 * 5. Releasing the environment (without unregistering) releases kiln's factory.
 *
 * Not covered, by design: running or releasing a session after ReleaseEnv.
 * ORT 1.31.1 itself crashes there with its CPU EP alone (the environment
 * must outlive its sessions), so no EP can make that order safe.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef OrtStatus* (*release_factory_fn)(OrtEpFactory*);

static const int64_t SHAPE_2x3x4[3] = {2, 3, 4};

static release_factory_fn lookup_release(void* handle) {
  void* sym = dlsym(handle, "ReleaseEpFactory");
  if (sym == NULL) die("dlsym ReleaseEpFactory: %s", dlerror());
  release_factory_fn fn;
  memcpy(&fn, &sym, sizeof fn);
  return fn;
}

static void check_device_details(OrtEnv* env) {
  size_t n = 0;
  ORT_CHECK(g_ort->GetNumHardwareDevices(env, &n));
  EXPECT(n > 0 && n < 16, "%zu hardware devices", n);
  const OrtHardwareDevice* hw[16];
  ORT_CHECK(g_ort->GetHardwareDevices(env, hw, n));
  for (size_t i = 0; i < n; ++i) {
    OrtDeviceEpIncompatibilityDetails* details = NULL;
    ORT_CHECK(g_ort->GetHardwareDeviceEpIncompatibilityDetails(env, KILN_EP_NAME, hw[i], &details));
    uint32_t reasons = 99;
    int32_t code = 99;
    const char* notes = NULL;
    ORT_CHECK(g_ort->DeviceEpIncompatibilityDetails_GetReasonsBitmask(details, &reasons));
    ORT_CHECK(g_ort->DeviceEpIncompatibilityDetails_GetErrorCode(details, &code));
    ORT_CHECK(g_ort->DeviceEpIncompatibilityDetails_GetNotes(details, &notes));
    EXPECT(notes != NULL, "no notes");
    if (g_ort->HardwareDevice_Type(hw[i]) == OrtHardwareDeviceType_CPU) {
      EXPECT(reasons == 0 && code == 0, "CPU: reasons %u code %d (%s)", reasons, code, notes);
      EXPECT(strstr(notes, "kiln runs on this CPU") != NULL, "CPU notes: %s", notes);
    } else {
      EXPECT(reasons == OrtDeviceEpIncompatibility_DEVICE_INCOMPATIBLE, "reasons %u (%s)", reasons,
             notes);
    }
    printf("hardware device %zu: reasons=%u code=%d notes=%s\n", i, reasons, code, notes);
    g_ort->ReleaseDeviceEpIncompatibilityDetails(details);
  }
}

static void run_and_compare(OrtSession* kiln, OrtSession* cpu) {
  const char* in_names[2] = {"A", "B"};
  const char* out_names[1] = {"Y"};
  Tensor in[2] = {tensor_pattern(SHAPE_2x3x4, 3, 1), tensor_pattern(SHAPE_2x3x4, 3, 2)};
  Tensor got, want;
  run_session(kiln, in_names, in, 2, out_names, &got, 1);
  run_session(cpu, in_names, in, 2, out_names, &want, 1);
  expect_close("add_mul_relu after unregister", &got, &want);
  tensor_free(&got);
  tensor_free(&want);
  tensor_free(&in[0]);
  tensor_free(&in[1]);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libkiln_ep.so> <models dir>\n", argv[0]);
    return 2;
  }
  const char* kiln_path = argv[1];
  char* model = path_join(argv[2], "add_mul_relu.onnx");
  harness_init();

  void* kiln_handle = NULL;
  kiln_ep_stats_fn stats = load_kiln_stats(kiln_path, &kiln_handle);
  release_factory_fn release = lookup_release(kiln_handle);
  int bogus[16] = {0};
  EXPECT(release(NULL) == NULL, "no status can exist before ORT loaded kiln");
  EXPECT(release((OrtEpFactory*)(void*)bogus) == NULL, "foreign pointer before load");

  OrtEnv* env = NULL;
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-lifetime", &env));
  OrtSession* cpu = create_session(env, model, NULL, NULL, 0, 0, NULL);
  for (int round = 0; round < 20; ++round) {
    char name[32];
    snprintf(name, sizeof name, "kiln_%d", round);
    ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, name, kiln_path));
    if (round == 0) check_device_details(env);
    DeviceInfo devs[8];
    EXPECT(kiln_devices(env, devs, 8) == 1, "want exactly one kiln device");
    KilnStats before = stats();
    OrtSession* session = create_session(env, model, devs[0].device, NULL, 0, 1, NULL);
    KilnStats mid = stats();
    EXPECT(mid.concurrency_queries - before.concurrency_queries == 1, "IsConcurrentRunSupported not asked");
    EXPECT(mid.sessions_initialized - before.sessions_initialized == 1, "OnSessionInitializationEnd not called");
    ORT_CHECK(g_ort->UnregisterExecutionProviderLibrary(env, name));
    run_and_compare(session, cpu);
    EXPECT(stats().factories_freed == mid.factories_freed, "factory freed while its EP lives");
    g_ort->ReleaseSession(session);
    KilnStats after = stats();
    EXPECT(after.factories_freed - mid.factories_freed == 1, "the last EP did not free the factory");
    EXPECT(after.eps_released - before.eps_released == 1, "EP not released");
  }
  KilnStats end = stats();
  EXPECT(end.factories_created == end.factories_freed, "%llu factories created, %llu freed",
         (unsigned long long)end.factories_created, (unsigned long long)end.factories_freed);

  OrtStatus* status = release(NULL);
  EXPECT(status != NULL && g_ort->GetErrorCode(status) == ORT_INVALID_ARGUMENT,
         "ReleaseEpFactory(NULL) after load: want INVALID_ARGUMENT");
  printf("ReleaseEpFactory(NULL): %s\n", g_ort->GetErrorMessage(status));
  g_ort->ReleaseStatus(status);

  g_ort->ReleaseSession(cpu);
  g_ort->ReleaseEnv(env);

  /* Releasing the environment unregisters kiln (no explicit unregister). */
  ORT_CHECK(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "kiln-c-lifetime-2", &env));
  ORT_CHECK(g_ort->RegisterExecutionProviderLibrary(env, "kiln_env", kiln_path));
  DeviceInfo devs[8];
  EXPECT(kiln_devices(env, devs, 8) == 1, "want exactly one kiln device");
  g_ort->ReleaseSession(create_session(env, model, devs[0].device, NULL, 0, 1, NULL));
  g_ort->ReleaseEnv(env);
  end = stats();
  EXPECT(end.factories_created == end.factories_freed, "ReleaseEnv left a factory: %llu created, %llu freed",
         (unsigned long long)end.factories_created, (unsigned long long)end.factories_freed);
  free(model);
  printf("lifetime: 20 register/unregister rounds with a session outliving each; %llu factories\n",
         (unsigned long long)end.factories_created);
  return 0;
}
