/*
 * kiln_ort_abi.h — kiln's own declaration of the subset of the ONNX Runtime
 * plugin-EP C ABI (ORT 1.31.1, ORT_API_VERSION 31) that kiln and its tests use.
 *
 * Written from the project's facts sheet (shared/ort-abi/ABI_FACTS.md), not
 * copied from ORT's headers. Tables ORT provides (OrtApi, OrtEpApi, ...) are
 * declared slot by slot: unused slots are `reserved_*` padding, and a static
 * assertion pins every declared member to its slot index, so a mistake fails
 * the build (bindgen runs clang over this file). Structs kiln implements
 * use their layouts as of API 31 (OrtEpFactory fn# 0-19, OrtEp fn# 0-24;
 * OrtNodeComputeInfo is unchanged since 23), and kiln sets
 * ort_version_supported = 31 on both: every member is implemented or a
 * deliberate NULL. ORT 1.31.1 reads OrtEpFactory fn# 13 whatever the
 * version says (facts sheet, section 3.1), so the struct must hold it.
 *
 * Linux/macOS only: ORTCHAR_T is char and ORT_API_CALL is empty there.
 */
#ifndef KILN_ORT_ABI_H
#define KILN_ORT_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORT_API_VERSION 31

#define KILN_ASSERT_SLOT(table, member, slot)                                 \
  _Static_assert(offsetof(struct table, member) == (slot) * sizeof(void*),    \
                 #table "." #member " must be slot " #slot)

typedef char ORTCHAR_T;

/* ---- enums (C int) ------------------------------------------------------ */

typedef enum OrtErrorCode {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_NO_SUCHFILE = 3,
  ORT_NO_MODEL = 4,
  ORT_ENGINE_ERROR = 5,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_PROTOBUF = 7,
  ORT_MODEL_LOADED = 8,
  ORT_NOT_IMPLEMENTED = 9,
  ORT_INVALID_GRAPH = 10,
  ORT_EP_FAIL = 11,
  ORT_MODEL_LOAD_CANCELED = 12,
  ORT_MODEL_REQUIRES_COMPILATION = 13,
  ORT_NOT_FOUND = 14,
  ORT_DEVICE_RESET = 15
} OrtErrorCode;

typedef enum ONNXTensorElementDataType {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64 = 14,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128 = 15,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16
} ONNXTensorElementDataType;

typedef enum ONNXType {
  ONNX_TYPE_UNKNOWN = 0,
  ONNX_TYPE_TENSOR = 1,
  ONNX_TYPE_SEQUENCE = 2,
  ONNX_TYPE_MAP = 3,
  ONNX_TYPE_OPAQUE = 4,
  ONNX_TYPE_SPARSETENSOR = 5,
  ONNX_TYPE_OPTIONAL = 6
} ONNXType;

typedef enum OrtLoggingLevel {
  ORT_LOGGING_LEVEL_VERBOSE = 0,
  ORT_LOGGING_LEVEL_INFO = 1,
  ORT_LOGGING_LEVEL_WARNING = 2,
  ORT_LOGGING_LEVEL_ERROR = 3,
  ORT_LOGGING_LEVEL_FATAL = 4
} OrtLoggingLevel;

typedef enum OrtHardwareDeviceType {
  OrtHardwareDeviceType_CPU = 0,
  OrtHardwareDeviceType_GPU = 1,
  OrtHardwareDeviceType_NPU = 2
} OrtHardwareDeviceType;

typedef enum OrtAllocatorType {
  OrtInvalidAllocator = -1,
  OrtDeviceAllocator = 0,
  OrtArenaAllocator = 1,
  OrtReadOnlyAllocator = 2
} OrtAllocatorType;

typedef enum OrtMemType {
  OrtMemTypeCPUInput = -2,
  OrtMemTypeCPUOutput = -1,
  OrtMemTypeCPU = OrtMemTypeCPUOutput,
  OrtMemTypeDefault = 0
} OrtMemType;

typedef enum OrtCompiledModelCompatibility {
  OrtCompiledModelCompatibility_EP_NOT_APPLICABLE = 0,
  OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL = 1,
  OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION = 2,
  OrtCompiledModelCompatibility_EP_UNSUPPORTED = 3
} OrtCompiledModelCompatibility;

typedef enum OrtOpAttrType {
  ORT_OP_ATTR_UNDEFINED = 0,
  ORT_OP_ATTR_INT = 1,
  ORT_OP_ATTR_INTS = 2,
  ORT_OP_ATTR_FLOAT = 3,
  ORT_OP_ATTR_FLOATS = 4,
  ORT_OP_ATTR_STRING = 5,
  ORT_OP_ATTR_STRINGS = 6,
  ORT_OP_ATTR_GRAPH = 7,
  ORT_OP_ATTR_TENSOR = 8
} OrtOpAttrType;

/* Why a hardware device cannot run an EP (bit mask; since 24). */
typedef enum OrtDeviceEpIncompatibilityReason {
  OrtDeviceEpIncompatibility_NONE = 0,
  OrtDeviceEpIncompatibility_DRIVER_INCOMPATIBLE = 1,
  OrtDeviceEpIncompatibility_DEVICE_INCOMPATIBLE = 2,
  OrtDeviceEpIncompatibility_MISSING_DEPENDENCY = 4,
  OrtDeviceEpIncompatibility_UNKNOWN = (int)(1u << 31)
} OrtDeviceEpIncompatibilityReason;

typedef enum OrtGraphCaptureNodeAssignmentPolicy {
  OrtGraphCaptureNodeAssignmentPolicy_ALL_NODES_ON_EP = 0,
  OrtGraphCaptureNodeAssignmentPolicy_ALLOW_CPU_FOR_SHAPES = 1
} OrtGraphCaptureNodeAssignmentPolicy;

typedef enum OrtWeightlessSupport {
  OrtWeightlessSupport_NONE = 0,
  OrtWeightlessSupport_EXTERNAL_ONLY = 1,
  OrtWeightlessSupport_ALL = 2
} OrtWeightlessSupport;

/* Bit flags of OrtCompileApi::ModelCompilationOptions_SetFlags. */
typedef enum OrtCompileApiFlags {
  OrtCompileApiFlags_NONE = 0,
  OrtCompileApiFlags_ERROR_IF_NO_NODES_COMPILED = 1,
  OrtCompileApiFlags_ERROR_IF_OUTPUT_FILE_EXISTS = 2
} OrtCompileApiFlags;

/* ---- opaque objects ------------------------------------------------------ */

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValue OrtValue;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtLogger OrtLogger;
typedef struct OrtKeyValuePairs OrtKeyValuePairs;
typedef struct OrtHardwareDevice OrtHardwareDevice;
typedef struct OrtEpDevice OrtEpDevice;
typedef struct OrtGraph OrtGraph;
typedef struct OrtNode OrtNode;
typedef struct OrtValueInfo OrtValueInfo;
typedef struct OrtEpGraphSupportInfo OrtEpGraphSupportInfo;
typedef struct OrtNodeComputeContext OrtNodeComputeContext;
typedef struct OrtThreadingOptions OrtThreadingOptions;
typedef struct OrtMemoryDevice OrtMemoryDevice;
typedef struct OrtDataTransferImpl OrtDataTransferImpl;
typedef struct OrtSyncStreamImpl OrtSyncStreamImpl;
typedef struct OrtAllocator OrtAllocator;
typedef struct OrtOpAttr OrtOpAttr;
typedef struct OrtModelMetadata OrtModelMetadata;
typedef struct OrtModelCompilationOptions OrtModelCompilationOptions;
typedef struct OrtDeviceEpIncompatibilityDetails OrtDeviceEpIncompatibilityDetails;
typedef struct OrtExternalResourceImporterImpl OrtExternalResourceImporterImpl;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtGraphicsInteropConfig OrtGraphicsInteropConfig;
typedef struct OrtKernelRegistry OrtKernelRegistry;
typedef struct OrtEpProfilerImpl OrtEpProfilerImpl;
typedef struct OrtResourceCount OrtResourceCount;
typedef struct OrtApi OrtApi;
typedef struct OrtModelEditorApi OrtModelEditorApi;
typedef struct OrtCompileApi OrtCompileApi;
typedef struct OrtEpApi OrtEpApi;
typedef struct OrtEpFactory OrtEpFactory;
typedef struct OrtEp OrtEp;
typedef struct OrtNodeComputeInfo OrtNodeComputeInfo;
typedef struct OrtNodeFusionOptions OrtNodeFusionOptions;

typedef OrtStatus* OrtStatusPtr;

/* ---- OrtApiBase and environment options --------------------------------- */

typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

const OrtApiBase* OrtGetApiBase(void);

typedef void (*OrtLoggingFunction)(void* param, OrtLoggingLevel severity,
                                   const char* category, const char* logid,
                                   const char* code_location,
                                   const char* message);

/* Argument of OrtApi::CreateEnvWithOptions (since 24). */
typedef struct OrtEnvCreationOptions {
  uint32_t version;
  int32_t logging_severity_level;
  const char* log_id;
  OrtLoggingFunction custom_logging_function;
  void* custom_logging_param;
  const OrtThreadingOptions* threading_options;
  const OrtKeyValuePairs* config_entries;
} OrtEnvCreationOptions;

/* Output callback of the compile API (stream output). */
typedef OrtStatus* (*OrtWriteBufferFunc)(void* state, const void* buffer,
                                         size_t buffer_num_bytes);

/* ---- tables ORT provides ------------------------------------------------- */

struct OrtApi {
  OrtStatus* (*CreateStatus)(OrtErrorCode code, const char* msg); /* 0 */
  OrtErrorCode (*GetErrorCode)(const OrtStatus* status); /* 1 */
  const char* (*GetErrorMessage)(const OrtStatus* status); /* 2 */
  OrtStatus* (*CreateEnv)(OrtLoggingLevel log_severity_level, const char* logid, OrtEnv** out); /* 3 */
  void* reserved_4_6[3];
  OrtStatus* (*CreateSession)(const OrtEnv* env, const ORTCHAR_T* model_path, const OrtSessionOptions* options, OrtSession** out); /* 7 */
  OrtStatus* (*CreateSessionFromArray)(const OrtEnv* env, const void* model_data, size_t model_data_length, const OrtSessionOptions* options, OrtSession** out); /* 8 */
  OrtStatus* (*Run)(OrtSession* session, const OrtRunOptions* run_options, const char* const* input_names, const OrtValue* const* inputs, size_t input_len, const char* const* output_names, size_t output_names_len, OrtValue** outputs); /* 9 */
  OrtStatus* (*CreateSessionOptions)(OrtSessionOptions** options); /* 10 */
  void* reserved_11_23[13];
  OrtStatus* (*SetIntraOpNumThreads)(OrtSessionOptions* options, int intra_op_num_threads); /* 24 */
  void* reserved_25_48[24];
  OrtStatus* (*CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo* info, void* p_data, size_t p_data_len, const int64_t* shape, size_t shape_len, ONNXTensorElementDataType type, OrtValue** out); /* 49 */
  void* reserved_50_50[1];
  OrtStatus* (*GetTensorMutableData)(OrtValue* value, void** out); /* 51 */
  void* reserved_52_54[3];
  OrtStatus* (*CastTypeInfoToTensorInfo)(const OrtTypeInfo* type_info, const OrtTensorTypeAndShapeInfo** out); /* 55 */
  OrtStatus* (*GetOnnxTypeFromTypeInfo)(const OrtTypeInfo* type_info, ONNXType* out); /* 56 */
  void* reserved_57_59[3];
  OrtStatus* (*GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType* out); /* 60 */
  OrtStatus* (*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out); /* 61 */
  OrtStatus* (*GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dim_values, size_t dim_values_length); /* 62 */
  OrtStatus* (*GetSymbolicDimensions)(const OrtTensorTypeAndShapeInfo* info, const char* dim_params[], size_t dim_params_length); /* 63 */
  OrtStatus* (*GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out); /* 64 */
  OrtStatus* (*GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out); /* 65 */
  void* reserved_66_68[3];
  OrtStatus* (*CreateCpuMemoryInfo)(OrtAllocatorType type, OrtMemType mem_type, OrtMemoryInfo** out); /* 69 */
  void* reserved_70_75[6];
  OrtStatus* (*AllocatorFree)(OrtAllocator* ort_allocator, void* p); /* 76 */
  void* reserved_77_77[1];
  OrtStatus* (*GetAllocatorWithDefaultOptions)(OrtAllocator** out); /* 78 */
  void* reserved_79_87[9];
  OrtStatus* (*KernelContext_GetInputCount)(const OrtKernelContext* context, size_t* out); /* 88 */
  OrtStatus* (*KernelContext_GetOutputCount)(const OrtKernelContext* context, size_t* out); /* 89 */
  OrtStatus* (*KernelContext_GetInput)(const OrtKernelContext* context, size_t index, const OrtValue** out); /* 90 */
  OrtStatus* (*KernelContext_GetOutput)(OrtKernelContext* context, size_t index, const int64_t* dim_values, size_t dim_count, OrtValue** out); /* 91 */
  void (*ReleaseEnv)(OrtEnv* input); /* 92 */
  void (*ReleaseStatus)(OrtStatus* input); /* 93 */
  void (*ReleaseMemoryInfo)(OrtMemoryInfo* input); /* 94 */
  void (*ReleaseSession)(OrtSession* input); /* 95 */
  void (*ReleaseValue)(OrtValue* input); /* 96 */
  void* reserved_97_98[2];
  void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* input); /* 99 */
  void (*ReleaseSessionOptions)(OrtSessionOptions* input); /* 100 */
  void* reserved_101_110[10];
  OrtStatus* (*SessionGetModelMetadata)(const OrtSession* session, OrtModelMetadata** out); /* 111 */
  void* reserved_112_115[4];
  OrtStatus* (*ModelMetadataLookupCustomMetadataMap)(const OrtModelMetadata* model_metadata, OrtAllocator* allocator, const char* key, char** value); /* 116 */
  void* reserved_117_117[1];
  void (*ReleaseModelMetadata)(OrtModelMetadata* input); /* 118 */
  void* reserved_119_129[11];
  OrtStatus* (*AddSessionConfigEntry)(OrtSessionOptions* options, const char* config_key, const char* config_value); /* 130 */
  void* reserved_131_210[80];
  OrtStatus* (*CreateOpAttr)(const char* name, const void* data, int len, OrtOpAttrType type, OrtOpAttr** op_attr); /* 211 */
  void (*ReleaseOpAttr)(OrtOpAttr* input); /* 212 */
  void* reserved_213_245[33];
  OrtStatus* (*KernelContext_GetLogger)(const OrtKernelContext* context, const OrtLogger** logger); /* 246 */
  OrtStatus* (*Logger_LogMessage)(const OrtLogger* logger, OrtLoggingLevel log_severity_level, const char* message, const ORTCHAR_T* file_path, int line_number, const char* func_name); /* 247 */
  OrtStatus* (*Logger_GetLoggingSeverityLevel)(const OrtLogger* logger, OrtLoggingLevel* out); /* 248 */
  void* reserved_249_271[23];
  OrtStatus* (*ReadOpAttr)(const OrtOpAttr* op_attr, OrtOpAttrType type, void* data, size_t len, size_t* out); /* 272 */
  void* reserved_273_273[1];
  OrtStatus* (*KernelContext_ParallelFor)(const OrtKernelContext* context, void (*fn)(void* usr_data, size_t index), size_t total, size_t num_batch, void* usr_data); /* 274 */
  void* reserved_275_285[11];
  void (*ReleaseNode)(OrtNode* input); /* 286 */
  void* reserved_287_288[2];
  OrtStatus* (*GetValueInfoName)(const OrtValueInfo* value_info, const char** name); /* 289 */
  OrtStatus* (*GetValueInfoTypeInfo)(const OrtValueInfo* value_info, const OrtTypeInfo** type_info); /* 290 */
  const OrtModelEditorApi* (*GetModelEditorApi)(void); /* 291 */
  void* reserved_292_293[2];
  const OrtCompileApi* (*GetCompileApi)(void); /* 294 */
  void (*CreateKeyValuePairs)(OrtKeyValuePairs** out); /* 295 */
  void (*AddKeyValuePair)(OrtKeyValuePairs* kvps, const char* key, const char* value); /* 296 */
  const char* (*GetKeyValue)(const OrtKeyValuePairs* kvps, const char* key); /* 297 */
  void (*GetKeyValuePairs)(const OrtKeyValuePairs* kvps, const char* const** keys, const char* const** values, size_t* num_entries); /* 298 */
  void* reserved_299_299[1];
  void (*ReleaseKeyValuePairs)(OrtKeyValuePairs* input); /* 300 */
  OrtStatus* (*RegisterExecutionProviderLibrary)(OrtEnv* env, const char* registration_name, const ORTCHAR_T* path); /* 301 */
  OrtStatus* (*UnregisterExecutionProviderLibrary)(OrtEnv* env, const char* registration_name); /* 302 */
  OrtStatus* (*GetEpDevices)(const OrtEnv* env, const OrtEpDevice* const** ep_devices, size_t* num_ep_devices); /* 303 */
  OrtStatus* (*SessionOptionsAppendExecutionProvider_V2)(OrtSessionOptions* session_options, OrtEnv* env, const OrtEpDevice* const* ep_devices, size_t num_ep_devices, const char* const* ep_option_keys, const char* const* ep_option_vals, size_t num_ep_options); /* 304 */
  void* reserved_305_306[2];
  OrtHardwareDeviceType (*HardwareDevice_Type)(const OrtHardwareDevice* device); /* 307 */
  uint32_t (*HardwareDevice_VendorId)(const OrtHardwareDevice* device); /* 308 */
  const char* (*HardwareDevice_Vendor)(const OrtHardwareDevice* device); /* 309 */
  uint32_t (*HardwareDevice_DeviceId)(const OrtHardwareDevice* device); /* 310 */
  const OrtKeyValuePairs* (*HardwareDevice_Metadata)(const OrtHardwareDevice* device); /* 311 */
  const char* (*EpDevice_EpName)(const OrtEpDevice* ep_device); /* 312 */
  const char* (*EpDevice_EpVendor)(const OrtEpDevice* ep_device); /* 313 */
  const OrtKeyValuePairs* (*EpDevice_EpMetadata)(const OrtEpDevice* ep_device); /* 314 */
  const OrtKeyValuePairs* (*EpDevice_EpOptions)(const OrtEpDevice* ep_device); /* 315 */
  const OrtHardwareDevice* (*EpDevice_Device)(const OrtEpDevice* ep_device); /* 316 */
  const OrtEpApi* (*GetEpApi)(void); /* 317 */
  void* reserved_318_322[5];
  OrtStatus* (*ValueInfo_GetValueProducer)(const OrtValueInfo* value_info, const OrtNode** producer_node, size_t* producer_output_index); /* 323 */
  void* reserved_324_325[2];
  OrtStatus* (*ValueInfo_GetInitializerValue)(const OrtValueInfo* value_info, const OrtValue** initializer_value); /* 326 */
  void* reserved_327_330[4];
  OrtStatus* (*ValueInfo_IsConstantInitializer)(const OrtValueInfo* value_info, bool* is_constant_initializer); /* 331 */
  void* reserved_332_332[1];
  OrtStatus* (*Graph_GetName)(const OrtGraph* graph, const char** graph_name); /* 333 */
  OrtStatus* (*Graph_GetModelPath)(const OrtGraph* graph, const ORTCHAR_T** model_path); /* 334 */
  void* reserved_335_341[7];
  OrtStatus* (*Graph_GetNumInitializers)(const OrtGraph* graph, size_t* num_initializers); /* 342 */
  OrtStatus* (*Graph_GetInitializers)(const OrtGraph* graph, const OrtValueInfo** initializers, size_t num_initializers); /* 343 */
  OrtStatus* (*Graph_GetNumNodes)(const OrtGraph* graph, size_t* num_nodes); /* 344 */
  OrtStatus* (*Graph_GetNodes)(const OrtGraph* graph, const OrtNode** nodes, size_t num_nodes); /* 345 */
  OrtStatus* (*Graph_GetParentNode)(const OrtGraph* graph, const OrtNode** node); /* 346 */
  void* reserved_347_347[1];
  OrtStatus* (*Node_GetId)(const OrtNode* node, size_t* node_id); /* 348 */
  OrtStatus* (*Node_GetName)(const OrtNode* node, const char** node_name); /* 349 */
  OrtStatus* (*Node_GetOperatorType)(const OrtNode* node, const char** operator_type); /* 350 */
  OrtStatus* (*Node_GetDomain)(const OrtNode* node, const char** domain_name); /* 351 */
  OrtStatus* (*Node_GetSinceVersion)(const OrtNode* node, int* since_version); /* 352 */
  OrtStatus* (*Node_GetNumInputs)(const OrtNode* node, size_t* num_inputs); /* 353 */
  OrtStatus* (*Node_GetInputs)(const OrtNode* node, const OrtValueInfo** inputs, size_t num_inputs); /* 354 */
  OrtStatus* (*Node_GetNumOutputs)(const OrtNode* node, size_t* num_outputs); /* 355 */
  OrtStatus* (*Node_GetOutputs)(const OrtNode* node, const OrtValueInfo** outputs, size_t num_outputs); /* 356 */
  OrtStatus* (*Node_GetNumImplicitInputs)(const OrtNode* node, size_t* num_implicit_inputs); /* 357 */
  OrtStatus* (*Node_GetImplicitInputs)(const OrtNode* node, const OrtValueInfo** implicit_inputs, size_t num_implicit_inputs); /* 358 */
  OrtStatus* (*Node_GetNumAttributes)(const OrtNode* node, size_t* num_attributes); /* 359 */
  OrtStatus* (*Node_GetAttributes)(const OrtNode* node, const OrtOpAttr** attributes, size_t num_attributes); /* 360 */
  OrtStatus* (*Node_GetAttributeByName)(const OrtNode* node, const char* attribute_name, const OrtOpAttr** attribute); /* 361 */
  OrtStatus* (*OpAttr_GetTensorAttributeAsOrtValue)(const OrtOpAttr* attribute, OrtValue** attr_tensor); /* 362 */
  OrtStatus* (*OpAttr_GetType)(const OrtOpAttr* attribute, OrtOpAttrType* type); /* 363 */
  OrtStatus* (*OpAttr_GetName)(const OrtOpAttr* attribute, const char** name); /* 364 */
  void* reserved_365_377[13];
  OrtStatus* (*GetTensorData)(const OrtValue* value, const void** out); /* 378 */
  OrtStatus* (*GetSessionOptionsConfigEntries)(const OrtSessionOptions* options, OrtKeyValuePairs** out); /* 379 */
  void* reserved_380_387[8];
  OrtStatus* (*GetModelCompatibilityForEpDevices)(const OrtEpDevice* const* ep_devices, size_t num_ep_devices, const char* compatibility_info, OrtCompiledModelCompatibility* out_status); /* 388 */
  void* reserved_389_389[1];
  bool (*TensorTypeAndShape_HasShape)(const OrtTensorTypeAndShapeInfo* info); /* 390 */
  void* reserved_391_396[6];
  OrtStatus* (*GetNumHardwareDevices)(const OrtEnv* env, size_t* num_devices); /* 397 */
  OrtStatus* (*GetHardwareDevices)(const OrtEnv* env, const OrtHardwareDevice** devices, size_t num_devices); /* 398 */
  OrtStatus* (*GetHardwareDeviceEpIncompatibilityDetails)(const OrtEnv* env, const char* ep_name, const OrtHardwareDevice* hw, OrtDeviceEpIncompatibilityDetails** details); /* 399 */
  OrtStatus* (*DeviceEpIncompatibilityDetails_GetReasonsBitmask)(const OrtDeviceEpIncompatibilityDetails* details, uint32_t* reasons_bitmask); /* 400 */
  OrtStatus* (*DeviceEpIncompatibilityDetails_GetNotes)(const OrtDeviceEpIncompatibilityDetails* details, const char** notes); /* 401 */
  OrtStatus* (*DeviceEpIncompatibilityDetails_GetErrorCode)(const OrtDeviceEpIncompatibilityDetails* details, int32_t* error_code); /* 402 */
  void (*ReleaseDeviceEpIncompatibilityDetails)(OrtDeviceEpIncompatibilityDetails* input); /* 403 */
  void* reserved_404_405[2];
  OrtStatus* (*CreateEnvWithOptions)(const OrtEnvCreationOptions* options, OrtEnv** out); /* 406 */
  void* reserved_407_427[21];
};
KILN_ASSERT_SLOT(OrtApi, CreateStatus, 0);
KILN_ASSERT_SLOT(OrtApi, GetErrorCode, 1);
KILN_ASSERT_SLOT(OrtApi, GetErrorMessage, 2);
KILN_ASSERT_SLOT(OrtApi, CreateEnv, 3);
KILN_ASSERT_SLOT(OrtApi, CreateSession, 7);
KILN_ASSERT_SLOT(OrtApi, CreateSessionFromArray, 8);
KILN_ASSERT_SLOT(OrtApi, Run, 9);
KILN_ASSERT_SLOT(OrtApi, CreateSessionOptions, 10);
KILN_ASSERT_SLOT(OrtApi, SetIntraOpNumThreads, 24);
KILN_ASSERT_SLOT(OrtApi, CreateTensorWithDataAsOrtValue, 49);
KILN_ASSERT_SLOT(OrtApi, GetTensorMutableData, 51);
KILN_ASSERT_SLOT(OrtApi, CastTypeInfoToTensorInfo, 55);
KILN_ASSERT_SLOT(OrtApi, GetOnnxTypeFromTypeInfo, 56);
KILN_ASSERT_SLOT(OrtApi, GetTensorElementType, 60);
KILN_ASSERT_SLOT(OrtApi, GetDimensionsCount, 61);
KILN_ASSERT_SLOT(OrtApi, GetDimensions, 62);
KILN_ASSERT_SLOT(OrtApi, GetSymbolicDimensions, 63);
KILN_ASSERT_SLOT(OrtApi, GetTensorShapeElementCount, 64);
KILN_ASSERT_SLOT(OrtApi, GetTensorTypeAndShape, 65);
KILN_ASSERT_SLOT(OrtApi, CreateCpuMemoryInfo, 69);
KILN_ASSERT_SLOT(OrtApi, AllocatorFree, 76);
KILN_ASSERT_SLOT(OrtApi, GetAllocatorWithDefaultOptions, 78);
KILN_ASSERT_SLOT(OrtApi, KernelContext_GetInputCount, 88);
KILN_ASSERT_SLOT(OrtApi, KernelContext_GetOutputCount, 89);
KILN_ASSERT_SLOT(OrtApi, KernelContext_GetInput, 90);
KILN_ASSERT_SLOT(OrtApi, KernelContext_GetOutput, 91);
KILN_ASSERT_SLOT(OrtApi, ReleaseEnv, 92);
KILN_ASSERT_SLOT(OrtApi, ReleaseStatus, 93);
KILN_ASSERT_SLOT(OrtApi, ReleaseMemoryInfo, 94);
KILN_ASSERT_SLOT(OrtApi, ReleaseSession, 95);
KILN_ASSERT_SLOT(OrtApi, ReleaseValue, 96);
KILN_ASSERT_SLOT(OrtApi, ReleaseTensorTypeAndShapeInfo, 99);
KILN_ASSERT_SLOT(OrtApi, ReleaseSessionOptions, 100);
KILN_ASSERT_SLOT(OrtApi, SessionGetModelMetadata, 111);
KILN_ASSERT_SLOT(OrtApi, ModelMetadataLookupCustomMetadataMap, 116);
KILN_ASSERT_SLOT(OrtApi, ReleaseModelMetadata, 118);
KILN_ASSERT_SLOT(OrtApi, AddSessionConfigEntry, 130);
KILN_ASSERT_SLOT(OrtApi, CreateOpAttr, 211);
KILN_ASSERT_SLOT(OrtApi, ReleaseOpAttr, 212);
KILN_ASSERT_SLOT(OrtApi, KernelContext_GetLogger, 246);
KILN_ASSERT_SLOT(OrtApi, Logger_LogMessage, 247);
KILN_ASSERT_SLOT(OrtApi, Logger_GetLoggingSeverityLevel, 248);
KILN_ASSERT_SLOT(OrtApi, ReadOpAttr, 272);
KILN_ASSERT_SLOT(OrtApi, KernelContext_ParallelFor, 274);
KILN_ASSERT_SLOT(OrtApi, ReleaseNode, 286);
KILN_ASSERT_SLOT(OrtApi, GetValueInfoName, 289);
KILN_ASSERT_SLOT(OrtApi, GetValueInfoTypeInfo, 290);
KILN_ASSERT_SLOT(OrtApi, GetModelEditorApi, 291);
KILN_ASSERT_SLOT(OrtApi, GetCompileApi, 294);
KILN_ASSERT_SLOT(OrtApi, CreateKeyValuePairs, 295);
KILN_ASSERT_SLOT(OrtApi, AddKeyValuePair, 296);
KILN_ASSERT_SLOT(OrtApi, GetKeyValue, 297);
KILN_ASSERT_SLOT(OrtApi, GetKeyValuePairs, 298);
KILN_ASSERT_SLOT(OrtApi, ReleaseKeyValuePairs, 300);
KILN_ASSERT_SLOT(OrtApi, RegisterExecutionProviderLibrary, 301);
KILN_ASSERT_SLOT(OrtApi, UnregisterExecutionProviderLibrary, 302);
KILN_ASSERT_SLOT(OrtApi, GetEpDevices, 303);
KILN_ASSERT_SLOT(OrtApi, SessionOptionsAppendExecutionProvider_V2, 304);
KILN_ASSERT_SLOT(OrtApi, HardwareDevice_Type, 307);
KILN_ASSERT_SLOT(OrtApi, HardwareDevice_VendorId, 308);
KILN_ASSERT_SLOT(OrtApi, HardwareDevice_Vendor, 309);
KILN_ASSERT_SLOT(OrtApi, HardwareDevice_DeviceId, 310);
KILN_ASSERT_SLOT(OrtApi, HardwareDevice_Metadata, 311);
KILN_ASSERT_SLOT(OrtApi, EpDevice_EpName, 312);
KILN_ASSERT_SLOT(OrtApi, EpDevice_EpVendor, 313);
KILN_ASSERT_SLOT(OrtApi, EpDevice_EpMetadata, 314);
KILN_ASSERT_SLOT(OrtApi, EpDevice_EpOptions, 315);
KILN_ASSERT_SLOT(OrtApi, EpDevice_Device, 316);
KILN_ASSERT_SLOT(OrtApi, GetEpApi, 317);
KILN_ASSERT_SLOT(OrtApi, ValueInfo_GetValueProducer, 323);
KILN_ASSERT_SLOT(OrtApi, ValueInfo_GetInitializerValue, 326);
KILN_ASSERT_SLOT(OrtApi, ValueInfo_IsConstantInitializer, 331);
KILN_ASSERT_SLOT(OrtApi, Graph_GetName, 333);
KILN_ASSERT_SLOT(OrtApi, Graph_GetModelPath, 334);
KILN_ASSERT_SLOT(OrtApi, Graph_GetNumInitializers, 342);
KILN_ASSERT_SLOT(OrtApi, Graph_GetInitializers, 343);
KILN_ASSERT_SLOT(OrtApi, Graph_GetNumNodes, 344);
KILN_ASSERT_SLOT(OrtApi, Graph_GetNodes, 345);
KILN_ASSERT_SLOT(OrtApi, Graph_GetParentNode, 346);
KILN_ASSERT_SLOT(OrtApi, Node_GetId, 348);
KILN_ASSERT_SLOT(OrtApi, Node_GetName, 349);
KILN_ASSERT_SLOT(OrtApi, Node_GetOperatorType, 350);
KILN_ASSERT_SLOT(OrtApi, Node_GetDomain, 351);
KILN_ASSERT_SLOT(OrtApi, Node_GetSinceVersion, 352);
KILN_ASSERT_SLOT(OrtApi, Node_GetNumInputs, 353);
KILN_ASSERT_SLOT(OrtApi, Node_GetInputs, 354);
KILN_ASSERT_SLOT(OrtApi, Node_GetNumOutputs, 355);
KILN_ASSERT_SLOT(OrtApi, Node_GetOutputs, 356);
KILN_ASSERT_SLOT(OrtApi, Node_GetNumImplicitInputs, 357);
KILN_ASSERT_SLOT(OrtApi, Node_GetImplicitInputs, 358);
KILN_ASSERT_SLOT(OrtApi, Node_GetNumAttributes, 359);
KILN_ASSERT_SLOT(OrtApi, Node_GetAttributes, 360);
KILN_ASSERT_SLOT(OrtApi, Node_GetAttributeByName, 361);
KILN_ASSERT_SLOT(OrtApi, OpAttr_GetTensorAttributeAsOrtValue, 362);
KILN_ASSERT_SLOT(OrtApi, OpAttr_GetType, 363);
KILN_ASSERT_SLOT(OrtApi, OpAttr_GetName, 364);
KILN_ASSERT_SLOT(OrtApi, GetTensorData, 378);
KILN_ASSERT_SLOT(OrtApi, GetSessionOptionsConfigEntries, 379);
KILN_ASSERT_SLOT(OrtApi, GetModelCompatibilityForEpDevices, 388);
KILN_ASSERT_SLOT(OrtApi, TensorTypeAndShape_HasShape, 390);
KILN_ASSERT_SLOT(OrtApi, GetNumHardwareDevices, 397);
KILN_ASSERT_SLOT(OrtApi, GetHardwareDevices, 398);
KILN_ASSERT_SLOT(OrtApi, GetHardwareDeviceEpIncompatibilityDetails, 399);
KILN_ASSERT_SLOT(OrtApi, DeviceEpIncompatibilityDetails_GetReasonsBitmask, 400);
KILN_ASSERT_SLOT(OrtApi, DeviceEpIncompatibilityDetails_GetNotes, 401);
KILN_ASSERT_SLOT(OrtApi, DeviceEpIncompatibilityDetails_GetErrorCode, 402);
KILN_ASSERT_SLOT(OrtApi, ReleaseDeviceEpIncompatibilityDetails, 403);
KILN_ASSERT_SLOT(OrtApi, CreateEnvWithOptions, 406);

struct OrtEpApi {
  OrtStatus* (*CreateEpDevice)(OrtEpFactory* ep_factory, const OrtHardwareDevice* hardware_device, const OrtKeyValuePairs* ep_metadata, const OrtKeyValuePairs* ep_options, OrtEpDevice** ep_device); /* 0 */
  void (*ReleaseEpDevice)(OrtEpDevice* input); /* 1 */
  OrtStatus* (*EpGraphSupportInfo_AddNodesToFuse)(OrtEpGraphSupportInfo* graph_support_info, const OrtNode* const* nodes, size_t num_nodes, const OrtNodeFusionOptions* node_fusion_options); /* 2 */
  void* reserved_3_15[13];
  OrtStatus* (*CreateHardwareDevice)(OrtHardwareDeviceType type, uint32_t vendor_id, uint32_t device_id, const char* vendor_name, const OrtKeyValuePairs* metadata, OrtHardwareDevice** hardware_device); /* 16 */
  void (*ReleaseHardwareDevice)(OrtHardwareDevice* input); /* 17 */
  void* reserved_18_43[26];
  OrtStatus* (*DeviceEpIncompatibilityDetails_SetDetails)(OrtDeviceEpIncompatibilityDetails* details, uint32_t reasons_bitmask, int32_t error_code, const char* notes); /* 44 */
  void* reserved_45_48[4];
  OrtStatus* (*GetEnvConfigEntries)(OrtKeyValuePairs** config_entries); /* 49 */
  void* reserved_50_77[28];
};
KILN_ASSERT_SLOT(OrtEpApi, CreateEpDevice, 0);
KILN_ASSERT_SLOT(OrtEpApi, ReleaseEpDevice, 1);
KILN_ASSERT_SLOT(OrtEpApi, EpGraphSupportInfo_AddNodesToFuse, 2);
KILN_ASSERT_SLOT(OrtEpApi, CreateHardwareDevice, 16);
KILN_ASSERT_SLOT(OrtEpApi, ReleaseHardwareDevice, 17);
KILN_ASSERT_SLOT(OrtEpApi, DeviceEpIncompatibilityDetails_SetDetails, 44);
KILN_ASSERT_SLOT(OrtEpApi, GetEnvConfigEntries, 49);

struct OrtModelEditorApi {
  void* reserved_0_5[6];
  OrtStatus* (*CreateNode)(const char* operator_name, const char* domain_name, const char* node_name, const char* const* input_names, size_t input_names_len, const char* const* output_names, size_t output_names_len, OrtOpAttr** attributes, size_t attribs_len, OrtNode** node); /* 6 */
  void* reserved_7_19[13];
};
KILN_ASSERT_SLOT(OrtModelEditorApi, CreateNode, 6);

struct OrtCompileApi {
  void (*ReleaseModelCompilationOptions)(OrtModelCompilationOptions* input); /* 0 */
  OrtStatus* (*CreateModelCompilationOptionsFromSessionOptions)(const OrtEnv* env, const OrtSessionOptions* session_options, OrtModelCompilationOptions** out); /* 1 */
  OrtStatus* (*ModelCompilationOptions_SetInputModelPath)(OrtModelCompilationOptions* model_compile_options, const ORTCHAR_T* input_model_path); /* 2 */
  OrtStatus* (*ModelCompilationOptions_SetInputModelFromBuffer)(OrtModelCompilationOptions* model_compile_options, const void* input_model_data, size_t input_model_data_size); /* 3 */
  OrtStatus* (*ModelCompilationOptions_SetOutputModelPath)(OrtModelCompilationOptions* model_compile_options, const ORTCHAR_T* output_model_path); /* 4 */
  void* reserved_5_5[1];
  OrtStatus* (*ModelCompilationOptions_SetOutputModelBuffer)(OrtModelCompilationOptions* model_compile_options, OrtAllocator* allocator, void** output_model_buffer_ptr, size_t* output_model_buffer_size_ptr); /* 6 */
  OrtStatus* (*ModelCompilationOptions_SetEpContextEmbedMode)(OrtModelCompilationOptions* model_compile_options, bool embed_ep_context_in_model); /* 7 */
  OrtStatus* (*CompileModel)(const OrtEnv* env, const OrtModelCompilationOptions* model_options); /* 8 */
  OrtStatus* (*ModelCompilationOptions_SetFlags)(OrtModelCompilationOptions* model_compile_options, uint32_t flags); /* 9 */
  void* reserved_10_11[2];
  OrtStatus* (*ModelCompilationOptions_SetOutputModelWriteFunc)(OrtModelCompilationOptions* model_compile_options, OrtWriteBufferFunc write_func, void* state); /* 12 */
  void* reserved_13_18[6];
};
KILN_ASSERT_SLOT(OrtCompileApi, ReleaseModelCompilationOptions, 0);
KILN_ASSERT_SLOT(OrtCompileApi, CreateModelCompilationOptionsFromSessionOptions, 1);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetInputModelPath, 2);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetInputModelFromBuffer, 3);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetOutputModelPath, 4);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetOutputModelBuffer, 6);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetEpContextEmbedMode, 7);
KILN_ASSERT_SLOT(OrtCompileApi, CompileModel, 8);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetFlags, 9);
KILN_ASSERT_SLOT(OrtCompileApi, ModelCompilationOptions_SetOutputModelWriteFunc, 12);

/* ---- structs kiln implements (layouts as of API 31) ------------------------ */

struct OrtNodeFusionOptions {
  uint32_t ort_version_supported;
  bool drop_constant_initializers;
};

struct OrtNodeComputeInfo {
  uint32_t ort_version_supported;
  OrtStatus* (*CreateState)(OrtNodeComputeInfo* this_ptr,
                            OrtNodeComputeContext* compute_context,
                            void** compute_state);
  OrtStatus* (*Compute)(OrtNodeComputeInfo* this_ptr, void* compute_state,
                        OrtKernelContext* kernel_context);
  void (*ReleaseState)(OrtNodeComputeInfo* this_ptr, void* compute_state);
};

typedef enum OrtEpDataLayout {
  OrtEpDataLayout_NCHW = 0,
  OrtEpDataLayout_NHWC = 1,
  OrtEpDataLayout_Default = OrtEpDataLayout_NCHW
} OrtEpDataLayout;

struct OrtEp {
  uint32_t ort_version_supported;
  const char* (*GetName)(const OrtEp* this_ptr);
  OrtStatus* (*GetCapability)(OrtEp* this_ptr, const OrtGraph* graph,
                              OrtEpGraphSupportInfo* graph_support_info);
  OrtStatus* (*Compile)(OrtEp* this_ptr, const OrtGraph** graphs,
                        const OrtNode** fused_nodes, size_t count,
                        OrtNodeComputeInfo** node_compute_infos,
                        OrtNode** ep_context_nodes);
  void (*ReleaseNodeComputeInfos)(OrtEp* this_ptr,
                                  OrtNodeComputeInfo** node_compute_infos,
                                  size_t num_node_compute_infos);
  OrtStatus* (*GetPreferredDataLayout)(OrtEp* this_ptr,
                                       OrtEpDataLayout* preferred_data_layout);
  OrtStatus* (*ShouldConvertDataLayoutForOp)(OrtEp* this_ptr,
                                             const char* domain,
                                             const char* op_type,
                                             OrtEpDataLayout target_data_layout,
                                             int* should_convert);
  OrtStatus* (*SetDynamicOptions)(OrtEp* this_ptr,
                                  const char* const* option_keys,
                                  const char* const* option_values,
                                  size_t num_options);
  OrtStatus* (*OnRunStart)(OrtEp* this_ptr, const OrtRunOptions* run_options);
  OrtStatus* (*OnRunEnd)(OrtEp* this_ptr, const OrtRunOptions* run_options,
                         bool sync_stream);
  OrtStatus* (*CreateAllocator)(OrtEp* this_ptr,
                                const OrtMemoryInfo* memory_info,
                                OrtAllocator** allocator);
  OrtStatus* (*CreateSyncStreamForDevice)(OrtEp* this_ptr,
                                          const OrtMemoryDevice* memory_device,
                                          OrtSyncStreamImpl** stream);
  const char* (*GetCompiledModelCompatibilityInfo)(OrtEp* this_ptr,
                                                   const OrtGraph* graph);
  /* ---- since 24 ---- */
  OrtStatus* (*GetKernelRegistry)(OrtEp* this_ptr,
                                  const OrtKernelRegistry** kernel_registry);
  OrtStatus* (*IsConcurrentRunSupported)(OrtEp* this_ptr, bool* is_supported);
  /* ---- since 25 ---- */
  OrtStatus* (*Sync)(OrtEp* this_ptr);
  OrtStatus* (*CreateProfiler)(OrtEp* this_ptr, OrtEpProfilerImpl** profiler);
  /* ---- since 26 ---- */
  bool (*IsGraphCaptureEnabled)(const OrtEp* this_ptr);
  bool (*IsGraphCaptured)(const OrtEp* this_ptr, int graph_annotation_id);
  OrtStatus* (*ReplayGraph)(OrtEp* this_ptr, int graph_annotation_id);
  OrtGraphCaptureNodeAssignmentPolicy (*GetGraphCaptureNodeAssignmentPolicy)(
      const OrtEp* this_ptr);
  OrtStatus* (*GetAvailableResource)(const OrtEp* this_ptr,
                                     OrtResourceCount* available);
  /* ---- since 27 ---- */
  OrtStatus* (*OnSessionInitializationEnd)(OrtEp* this_ptr);
  OrtStatus* (*GetDefaultMemoryDevice)(const OrtEp* this_ptr,
                                       const OrtMemoryDevice** device);
  OrtStatus* (*ReleaseCapturedGraph)(OrtEp* this_ptr, int graph_annotation_id);
  /* ---- since 29 ---- */
  OrtStatus* (*GetWeightlessSupport)(const OrtEp* this_ptr,
                                     OrtWeightlessSupport* support);
};

struct OrtEpFactory {
  uint32_t ort_version_supported;
  const char* (*GetName)(const OrtEpFactory* this_ptr);
  const char* (*GetVendor)(const OrtEpFactory* this_ptr);
  OrtStatus* (*GetSupportedDevices)(OrtEpFactory* this_ptr,
                                    const OrtHardwareDevice* const* devices,
                                    size_t num_devices,
                                    OrtEpDevice** ep_devices,
                                    size_t max_ep_devices,
                                    size_t* num_ep_devices);
  OrtStatus* (*CreateEp)(OrtEpFactory* this_ptr,
                         const OrtHardwareDevice* const* devices,
                         const OrtKeyValuePairs* const* ep_metadata_pairs,
                         size_t num_devices,
                         const OrtSessionOptions* session_options,
                         const OrtLogger* logger, OrtEp** ep);
  void (*ReleaseEp)(OrtEpFactory* this_ptr, OrtEp* ep);
  uint32_t (*GetVendorId)(const OrtEpFactory* this_ptr);
  const char* (*GetVersion)(const OrtEpFactory* this_ptr);
  OrtStatus* (*ValidateCompiledModelCompatibilityInfo)(
      OrtEpFactory* this_ptr, const OrtHardwareDevice* const* devices,
      size_t num_devices, const char* compatibility_info,
      OrtCompiledModelCompatibility* model_compatibility);
  OrtStatus* (*CreateAllocator)(OrtEpFactory* this_ptr,
                                const OrtMemoryInfo* memory_info,
                                const OrtKeyValuePairs* allocator_options,
                                OrtAllocator** allocator);
  void (*ReleaseAllocator)(OrtEpFactory* this_ptr, OrtAllocator* allocator);
  OrtStatus* (*CreateDataTransfer)(OrtEpFactory* this_ptr,
                                   OrtDataTransferImpl** data_transfer);
  bool (*IsStreamAware)(const OrtEpFactory* this_ptr);
  OrtStatus* (*CreateSyncStreamForDevice)(OrtEpFactory* this_ptr,
                                          const OrtMemoryDevice* memory_device,
                                          const OrtKeyValuePairs* stream_options,
                                          OrtSyncStreamImpl** stream);
  /* ---- since 24 ---- */
  OrtStatus* (*GetHardwareDeviceIncompatibilityDetails)(
      OrtEpFactory* this_ptr, const OrtHardwareDevice* hw,
      OrtDeviceEpIncompatibilityDetails* details);
  OrtStatus* (*CreateExternalResourceImporterForDevice)(
      OrtEpFactory* this_ptr, const OrtEpDevice* ep_device,
      OrtExternalResourceImporterImpl** out_importer);
  OrtStatus* (*GetNumCustomOpDomains)(OrtEpFactory* this_ptr,
                                      size_t* num_domains);
  OrtStatus* (*GetCustomOpDomains)(OrtEpFactory* this_ptr,
                                   OrtCustomOpDomain** domains,
                                   size_t num_domains);
  /* ---- since 25 ---- */
  OrtStatus* (*InitGraphicsInterop)(OrtEpFactory* this_ptr,
                                    const OrtEpDevice* ep_device,
                                    const OrtGraphicsInteropConfig* config);
  OrtStatus* (*DeinitGraphicsInterop)(OrtEpFactory* this_ptr,
                                      const OrtEpDevice* ep_device);
  /* ---- since 28 ---- */
  OrtStatus* (*SelectBestModelCandidate)(
      OrtEpFactory* this_ptr, const OrtHardwareDevice* device,
      const OrtKeyValuePairs* const* candidates, size_t num_candidates,
      const OrtSessionOptions* session_options, size_t* selected_index);
};

/* Layouts as of API 31: sizes on 64-bit, from the facts sheet (section 3). */
_Static_assert(sizeof(void*) != 8 || sizeof(struct OrtEpFactory) == 168, "OrtEpFactory (fn# 0-19) is 168 bytes");
_Static_assert(sizeof(void*) != 8 || sizeof(struct OrtEp) == 208, "OrtEp (fn# 0-24) is 208 bytes");
_Static_assert(sizeof(void*) != 8 || offsetof(struct OrtEpFactory, GetHardwareDeviceIncompatibilityDetails) == 112, "factory fn# 13 at 112");
_Static_assert(sizeof(void*) != 8 || offsetof(struct OrtEpFactory, SelectBestModelCandidate) == 160, "factory fn# 19 at 160");
_Static_assert(sizeof(void*) != 8 || offsetof(struct OrtEp, IsConcurrentRunSupported) == 112, "OrtEp fn# 13 at 112");
_Static_assert(sizeof(void*) != 8 || offsetof(struct OrtEp, OnSessionInitializationEnd) == 176, "OrtEp fn# 21 at 176");
_Static_assert(sizeof(void*) != 8 || offsetof(struct OrtEp, GetWeightlessSupport) == 200, "OrtEp fn# 24 at 200");
_Static_assert(sizeof(void*) != 8 || sizeof(struct OrtNodeComputeInfo) == 32, "OrtNodeComputeInfo is 32 bytes");
_Static_assert(sizeof(struct OrtNodeFusionOptions) == 8, "OrtNodeFusionOptions is 8 bytes");
_Static_assert(sizeof(struct OrtApiBase) == 2 * sizeof(void*), "OrtApiBase is two pointers");

#endif /* KILN_ORT_ABI_H */
