// What both custom ops of the library share: ONNX Runtime's API pointer, status helpers, a
// tensor's dimensions and data, and the OrtCustomOp table of an op described by a traits type.
#pragma once
#include <onnxruntime_c_api.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace chattts_ort {

inline const OrtApi*& api() {
  static const OrtApi* g = nullptr;
  return g;
}

inline OrtStatus* invalid(const std::string& msg) {
  return api()->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str());
}

#define CHATTTS_RETURN_IF(expr)              \
  do {                                       \
    if (OrtStatus* st_ = (expr)) return st_; \
  } while (0)

// v's dimensions and element count.
inline OrtStatus* dims_of(const OrtValue* v, std::vector<int64_t>& dims, size_t* count = nullptr) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  CHATTTS_RETURN_IF(api()->GetTensorTypeAndShape(v, &info));
  size_t nd = 0;
  OrtStatus* st = api()->GetDimensionsCount(info, &nd);
  if (!st) {
    dims.resize(nd);
    st = api()->GetDimensions(info, dims.data(), nd);
  }
  if (!st && count != nullptr) st = api()->GetTensorShapeElementCount(info, count);
  api()->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

template <typename T>
OrtStatus* data_of(const OrtValue* v, T*& out) {
  void* p = nullptr;
  CHATTTS_RETURN_IF(api()->GetTensorMutableData(const_cast<OrtValue*>(v), &p));
  out = static_cast<T*>(p);
  return nullptr;
}

// The op table for Op: static members kName, kInputs[], kOutputs[] (element types), create,
// compute and destroy; every input and output required, CPU only, any opset version.
template <typename Op>
OrtCustomOp make_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof(op));
  op.version = ORT_API_VERSION;
  op.GetName = [](const OrtCustomOp*) { return Op::kName; };
  op.GetExecutionProviderType = [](const OrtCustomOp*) { return "CPUExecutionProvider"; };
  op.GetInputType = [](const OrtCustomOp*, size_t i) { return Op::kInputs[i]; };
  op.GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return sizeof(Op::kInputs) / sizeof(Op::kInputs[0]); };
  op.GetOutputType = [](const OrtCustomOp*, size_t i) { return Op::kOutputs[i]; };
  op.GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return sizeof(Op::kOutputs) / sizeof(Op::kOutputs[0]); };
  op.KernelDestroy = Op::destroy;
  op.GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.CreateKernelV2 = Op::create;
  op.KernelComputeV2 = Op::compute;
  // No InferOutputShapeFn: ONNX Runtime's optimizer leaves the step graph the same without one.
  op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op.GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
  return op;
}

}  // namespace chattts_ort
