//! Checks of kiln's ABI declarations and exports:
//! - every OrtApi slot kiln declares sits where ort-sys 2.0.0-rc.15 (api-31) has it;
//! - every slot kiln declares is populated in the real 1.31.1 runtime;
//! - the cdylib exports only what kiln means to export;
//! - the committed cbindgen header matches the code.

mod common;

use std::collections::BTreeSet;
use std::mem::offset_of;
use std::process::Command;

use kiln_ep::ffi::sys;

/// Calls `$m!(Name)` for every OrtApi member kiln declares.
macro_rules! ort_api_slots {
    ($m:ident) => {
        $m!(
            CreateStatus,
            GetErrorCode,
            GetErrorMessage,
            CreateEnv,
            CreateSession,
            CreateSessionFromArray,
            Run,
            CreateSessionOptions,
            SetIntraOpNumThreads,
            CreateTensorWithDataAsOrtValue,
            GetTensorMutableData,
            CastTypeInfoToTensorInfo,
            GetOnnxTypeFromTypeInfo,
            GetTensorElementType,
            GetDimensionsCount,
            GetDimensions,
            GetSymbolicDimensions,
            GetTensorShapeElementCount,
            GetTensorTypeAndShape,
            CreateCpuMemoryInfo,
            AllocatorFree,
            GetAllocatorWithDefaultOptions,
            KernelContext_GetInputCount,
            KernelContext_GetOutputCount,
            KernelContext_GetInput,
            KernelContext_GetOutput,
            ReleaseEnv,
            ReleaseStatus,
            ReleaseMemoryInfo,
            ReleaseSession,
            ReleaseValue,
            ReleaseTensorTypeAndShapeInfo,
            ReleaseSessionOptions,
            SessionGetModelMetadata,
            ModelMetadataLookupCustomMetadataMap,
            ReleaseModelMetadata,
            AddSessionConfigEntry,
            CreateOpAttr,
            ReleaseOpAttr,
            KernelContext_GetLogger,
            Logger_LogMessage,
            Logger_GetLoggingSeverityLevel,
            ReadOpAttr,
            KernelContext_ParallelFor,
            ReleaseNode,
            GetValueInfoName,
            GetValueInfoTypeInfo,
            GetModelEditorApi,
            GetCompileApi,
            CreateKeyValuePairs,
            AddKeyValuePair,
            GetKeyValue,
            GetKeyValuePairs,
            ReleaseKeyValuePairs,
            RegisterExecutionProviderLibrary,
            UnregisterExecutionProviderLibrary,
            GetEpDevices,
            SessionOptionsAppendExecutionProvider_V2,
            HardwareDevice_Type,
            HardwareDevice_VendorId,
            HardwareDevice_Vendor,
            HardwareDevice_DeviceId,
            HardwareDevice_Metadata,
            EpDevice_EpName,
            EpDevice_EpVendor,
            EpDevice_EpMetadata,
            EpDevice_EpOptions,
            EpDevice_Device,
            GetEpApi,
            ValueInfo_GetValueProducer,
            ValueInfo_GetInitializerValue,
            ValueInfo_IsConstantInitializer,
            Graph_GetName,
            Graph_GetModelPath,
            Graph_GetNumInitializers,
            Graph_GetInitializers,
            Graph_GetNumNodes,
            Graph_GetNodes,
            Graph_GetParentNode,
            Node_GetId,
            Node_GetName,
            Node_GetOperatorType,
            Node_GetDomain,
            Node_GetSinceVersion,
            Node_GetNumInputs,
            Node_GetInputs,
            Node_GetNumOutputs,
            Node_GetOutputs,
            Node_GetNumImplicitInputs,
            Node_GetImplicitInputs,
            Node_GetNumAttributes,
            Node_GetAttributes,
            Node_GetAttributeByName,
            OpAttr_GetTensorAttributeAsOrtValue,
            OpAttr_GetType,
            OpAttr_GetName,
            GetTensorData,
            GetSessionOptionsConfigEntries,
            GetModelCompatibilityForEpDevices,
            TensorTypeAndShape_HasShape,
            GetNumHardwareDevices,
            GetHardwareDevices,
            GetHardwareDeviceEpIncompatibilityDetails,
            DeviceEpIncompatibilityDetails_GetReasonsBitmask,
            DeviceEpIncompatibilityDetails_GetNotes,
            DeviceEpIncompatibilityDetails_GetErrorCode,
            ReleaseDeviceEpIncompatibilityDetails,
            CreateEnvWithOptions
        )
    };
}

/// Calls `$m!(Name)` for every OrtEpApi member kiln declares.
macro_rules! ep_api_slots {
    ($m:ident) => {
        $m!(
            CreateEpDevice,
            ReleaseEpDevice,
            EpGraphSupportInfo_AddNodesToFuse,
            CreateHardwareDevice,
            ReleaseHardwareDevice,
            DeviceEpIncompatibilityDetails_SetDetails,
            GetEnvConfigEntries
        )
    };
}

/// Calls `$m!(Name)` for every OrtModelEditorApi member kiln declares.
macro_rules! editor_api_slots {
    ($m:ident) => {
        $m!(CreateNode)
    };
}

/// Calls `$m!(Name)` for every OrtCompileApi member kiln declares.
macro_rules! compile_api_slots {
    ($m:ident) => {
        $m!(
            ReleaseModelCompilationOptions,
            CreateModelCompilationOptionsFromSessionOptions,
            ModelCompilationOptions_SetInputModelPath,
            ModelCompilationOptions_SetInputModelFromBuffer,
            ModelCompilationOptions_SetOutputModelPath,
            ModelCompilationOptions_SetOutputModelBuffer,
            ModelCompilationOptions_SetEpContextEmbedMode,
            CompileModel,
            ModelCompilationOptions_SetFlags,
            ModelCompilationOptions_SetOutputModelWriteFunc
        )
    };
}

macro_rules! names {
    ($($name:ident),* $(,)?) => { [$(stringify!($name)),*].into_iter().map(String::from).collect::<BTreeSet<String>>() };
}

/// Member names declared inside `struct <name> { ... }` of kiln's header:
/// the first `(*name)` of each member line (a parameter may be a function
/// pointer too).
fn declared_members(table: &str) -> BTreeSet<String> {
    let header = std::fs::read_to_string(common::repo().join("include/kiln_ort_abi.h")).unwrap();
    let start = header.find(&format!("struct {table} {{")).expect("table in header");
    let body = &header[start..start + header[start..].find("};").unwrap()];
    body.lines()
        .filter_map(|line| {
            let rest = &line[line.find("(*")? + 2..];
            Some(rest[..rest.find(')')?].to_string())
        })
        .collect()
}

#[test]
fn test_lists_cover_every_declared_slot() {
    assert_eq!(ort_api_slots!(names), declared_members("OrtApi"));
    assert_eq!(ep_api_slots!(names), declared_members("OrtEpApi"));
    assert_eq!(editor_api_slots!(names), declared_members("OrtModelEditorApi"));
    assert_eq!(compile_api_slots!(names), declared_members("OrtCompileApi"));
}

#[test]
fn ort_api_slots_match_ort_sys() {
    macro_rules! same_offset {
        ($($name:ident),* $(,)?) => {$(
            assert_eq!(
                offset_of!(sys::OrtApi, $name),
                offset_of!(ort_sys::OrtApi, $name),
                concat!("OrtApi::", stringify!($name), " differs from ort-sys")
            );
        )*};
    }
    ort_api_slots!(same_offset);
}

#[test]
fn editor_and_compile_api_slots_match_ort_sys() {
    macro_rules! same_offset_in {
        ($ours:ty, $theirs:ty; $($name:ident),* $(,)?) => {$(
            assert_eq!(offset_of!($ours, $name), offset_of!($theirs, $name), stringify!($name));
        )*};
    }
    macro_rules! editor {
        ($($name:ident),* $(,)?) => { same_offset_in!(sys::OrtModelEditorApi, ort_sys::OrtModelEditorApi; $($name),*) };
    }
    macro_rules! compile {
        ($($name:ident),* $(,)?) => { same_offset_in!(sys::OrtCompileApi, ort_sys::OrtCompileApi; $($name),*) };
    }
    editor_api_slots!(editor);
    // ort-sys declares OrtCompileApi only up to CompileModel (slot 8); kiln's
    // slots 9 (SetFlags) and 12 (SetOutputModelWriteFunc) come from the facts
    // sheet and are exercised by the compile tests in ffi-tests/context.rs.
    compile!(
        ReleaseModelCompilationOptions,
        CreateModelCompilationOptionsFromSessionOptions,
        ModelCompilationOptions_SetInputModelPath,
        ModelCompilationOptions_SetInputModelFromBuffer,
        ModelCompilationOptions_SetOutputModelPath,
        ModelCompilationOptions_SetOutputModelBuffer,
        ModelCompilationOptions_SetEpContextEmbedMode,
        CompileModel
    );
}

#[test]
fn declared_slots_are_populated_in_ort_1_31_1() {
    let api = common::ort().api;
    macro_rules! present {
        ($($name:ident),* $(,)?) => {$( assert!(api.$name.is_some(), concat!("OrtApi::", stringify!($name), " is NULL")); )*};
    }
    ort_api_slots!(present);
    // SAFETY: GetEpApi returns ORT's static table.
    let ep = unsafe { &*(api.GetEpApi.unwrap())() };
    macro_rules! ep_present {
        ($($name:ident),* $(,)?) => {$( assert!(ep.$name.is_some(), concat!("OrtEpApi::", stringify!($name), " is NULL")); )*};
    }
    ep_api_slots!(ep_present);
    // SAFETY: both getters return ORT's static tables.
    let (editor, compile) = unsafe { (&*(api.GetModelEditorApi.unwrap())(), &*(api.GetCompileApi.unwrap())()) };
    macro_rules! editor_present {
        ($($name:ident),* $(,)?) => {$( assert!(editor.$name.is_some(), stringify!($name)); )*};
    }
    macro_rules! compile_present {
        ($($name:ident),* $(,)?) => {$( assert!(compile.$name.is_some(), stringify!($name)); )*};
    }
    editor_api_slots!(editor_present);
    compile_api_slots!(compile_present);
}

/// Asserts that the listed members of `$ty` sit at fn# 0, 1, 2, ... after
/// the leading `uint32_t ort_version_supported` (offset 8 + 8 * fn#).
macro_rules! members_in_order {
    ($ty:ty; $($name:ident),* $(,)?) => {{
        let offsets = [$(offset_of!($ty, $name)),*];
        let names = [$(stringify!($name)),*];
        for (k, (offset, name)) in offsets.iter().zip(names).enumerate() {
            assert_eq!(*offset, 8 + 8 * k, "{}::{name} is not fn# {k}", stringify!($ty));
        }
        offsets.len()
    }};
}

/// The structs kiln implements, as the facts sheet (section 3) lays them out
/// for API 31: OrtEpFactory fn# 0-19 (168 bytes), OrtEp fn# 0-24 (208 bytes).
#[test]
fn implemented_structs_have_api_31_layouts() {
    let factory = members_in_order!(sys::OrtEpFactory;
        GetName, GetVendor, GetSupportedDevices, CreateEp, ReleaseEp, GetVendorId, GetVersion,
        ValidateCompiledModelCompatibilityInfo, CreateAllocator, ReleaseAllocator, CreateDataTransfer,
        IsStreamAware, CreateSyncStreamForDevice, GetHardwareDeviceIncompatibilityDetails,
        CreateExternalResourceImporterForDevice, GetNumCustomOpDomains, GetCustomOpDomains,
        InitGraphicsInterop, DeinitGraphicsInterop, SelectBestModelCandidate);
    assert_eq!(factory, 20);
    assert_eq!(std::mem::size_of::<sys::OrtEpFactory>(), 8 + 8 * 20);
    let ep = members_in_order!(sys::OrtEp;
        GetName, GetCapability, Compile, ReleaseNodeComputeInfos, GetPreferredDataLayout,
        ShouldConvertDataLayoutForOp, SetDynamicOptions, OnRunStart, OnRunEnd, CreateAllocator,
        CreateSyncStreamForDevice, GetCompiledModelCompatibilityInfo, GetKernelRegistry,
        IsConcurrentRunSupported, Sync, CreateProfiler, IsGraphCaptureEnabled, IsGraphCaptured,
        ReplayGraph, GetGraphCaptureNodeAssignmentPolicy, GetAvailableResource,
        OnSessionInitializationEnd, GetDefaultMemoryDevice, ReleaseCapturedGraph, GetWeightlessSupport);
    assert_eq!(ep, 25);
    assert_eq!(std::mem::size_of::<sys::OrtEp>(), 8 + 8 * 25);
    assert_eq!(std::mem::size_of::<sys::OrtNodeComputeInfo>(), 32);
    assert_eq!(std::mem::size_of::<sys::OrtNodeFusionOptions>(), 8);
    assert_eq!(std::mem::size_of::<sys::OrtEnvCreationOptions>(), 48);
}

#[test]
fn cdylib_exports_only_kiln_symbols() {
    let lib = common::kiln_library_path();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let parts: Vec<_> = l.split_whitespace().collect();
            (parts.len() == 3 && matches!(parts[1], "T" | "D" | "B" | "R")).then(|| parts[2].to_string())
        })
        .collect();
    let expected: BTreeSet<String> = [
        "CreateEpFactories",
        "ReleaseEpFactory",
        "kiln_ep_check_options",
        "kiln_ep_inspect_context",
        "kiln_ep_last_left_out",
        "kiln_ep_stats",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(exported, expected);
}

#[test]
fn committed_header_matches_cbindgen() {
    let root = common::repo();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let path = root.join("include/kiln_ep.h");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kiln_ep.h is out of date; regenerate with `make header` (KILN_BLESS=1 cargo test --test abi)"
    );
}
