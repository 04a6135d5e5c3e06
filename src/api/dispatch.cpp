// The public entry points: validate everything, pick a backend, run it.
// An explicit backend that cannot run the problem throws its reason; Auto
// tries the backends fastest first and never falls back silently past an
// explicit choice.
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "api/backend.hpp"
#include "api/kv_cache.hpp"
#include "api/validate.hpp"
#include "api/varlen.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"

namespace gqattn {
namespace detail {
namespace {

// Fastest first. cuda-unfused is not among them: its memory and time grow
// with Tq x Tk (P in memory), so it runs only when named; a problem only it
// can run fails under Auto with the hint to name it.
constexpr Backend kAutoOrder[] = {Backend::CudaHopper, Backend::CudaFlash, Backend::CpuFlash,
                                  Backend::Cpu};

struct Choice {
  const BackendImpl* impl = nullptr;
  std::string reason;  // why nothing was chosen
};

std::string why_not(const BackendImpl& impl, const Problem& problem, DType dtype, Device device,
                    Pass pass) {
  if (problem.kv_cache && pass == Pass::backward)
    return "not supported: KV-cache calls are forward only";
  return pass == Pass::forward ? impl.why_not(problem, dtype, device)
                               : impl.why_not_backward(problem, dtype, device);
}

Choice choose(const Problem& problem, DType dtype, Device device, Backend requested, Pass pass) {
  Choice choice;
  if (requested != Backend::Auto) {
    std::string reason;
    const BackendImpl* impl = find_backend(requested, &reason);
    if (impl != nullptr) reason = why_not(*impl, problem, dtype, device, pass);
    if (reason.empty()) {
      choice.impl = impl;
    } else {
      choice.reason = std::string(backend_name(requested)) + ": " + reason;
    }
    return choice;
  }
  for (Backend candidate : kAutoOrder) {
    std::string reason;
    const BackendImpl* impl = find_backend(candidate, &reason);
    if (impl != nullptr) reason = why_not(*impl, problem, dtype, device, pass);
    if (reason.empty()) {
      choice.impl = impl;
      choice.reason.clear();
      return choice;
    }
    choice.reason +=
        (choice.reason.empty() ? "" : "; ") + std::string(backend_name(candidate)) + ": " + reason;
  }
  std::string unfused_reason;
  const BackendImpl* unfused = find_backend(Backend::CudaUnfused, &unfused_reason);
  if (unfused != nullptr && why_not(*unfused, problem, dtype, device, pass).empty())
    choice.reason +=
        "; cuda-unfused can run it but Auto never picks it (P of Tq x Tk in device memory): "
        "name it (Options::backend = Backend::CudaUnfused, backend=\"cuda-unfused\") to use it";
  return choice;
}

const BackendImpl* choose_or_throw(const Problem& problem, DType dtype, Device device,
                                   Backend requested, Pass pass) {
  Choice choice = choose(problem, dtype, device, requested, pass);
  if (choice.impl == nullptr) throw Error("backend", choice.reason);
  return choice.impl;
}

struct Named {
  const char* name;
  const TensorRef* tensor;
};

// The chosen backend's own per-tensor rules, before anything runs.
void require_tensors(const BackendImpl& impl, Pass pass, std::initializer_list<Named> tensors) {
  for (const Named& t : tensors) {
    if (t.tensor->data == nullptr) continue;  // forward's optional lse
    const std::string reason = impl.why_not_tensor(*t.tensor, t.name, pass);
    if (!reason.empty())
      throw Error("backend", std::string(backend_name(impl.id())) + ": " + reason);
  }
}

Problem resolved(const Problem& problem) {
  Problem p = problem;
  p.scale = problem.effective_scale();
  return p;
}

}  // namespace
}  // namespace detail

namespace detail {
namespace {

// The rule both overloads of a pass share: the dense ones take no offsets,
// the varlen ones need them.
void require_layout(const Problem& problem, bool varlen_call) {
  if (problem.kv_cache)
    throw Error("problem.kv_cache = true", "needs the cache: call forward_with_kv_cache");
  if (problem.varlen && !varlen_call)
    throw Error("problem.varlen = true",
                "needs the sequence offsets: call the overload that takes VarlenOffsets");
  if (!problem.varlen && varlen_call)
    throw Error("problem.varlen = false",
                "must be true for a call with sequence offsets (a packed batch)");
}

// The offsets of a varlen call: shape rules always; the values, copied to
// the host and checked, when they live there, when asked to
// (Options::check_offsets), or when the backend reads them on the host.
std::optional<HostOffsets> offsets_for(const Problem& problem, const VarlenOffsets& offsets,
                                       const TensorRef& q, const TensorRef& k,
                                       const BackendImpl& impl, const Options& options) {
  validate_offsets_shape(problem, offsets, q.device);
  const bool read = q.device == Device::cpu || options.check_offsets || impl.needs_host_offsets();
  if (!read) return std::nullopt;
  HostOffsets host = read_offsets(offsets, options.stream);
  check_offsets(problem, host, q.shape[0], k.shape[0]);
  return host;
}

void run_forward(const Problem& problem, const VarlenOffsets* offsets, const TensorRef& q,
                 const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
                 const Options& options) {
  require_layout(problem, offsets != nullptr);
  validate_problem(problem);
  validate_tensor(problem, Role::q, q, q.dtype, q.device);
  validate_tensor(problem, Role::k, k, q.dtype, q.device);
  const PackedTotals totals{q.shape[0], k.shape[0]};
  validate_tensor(problem, Role::v, v, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::o, o, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::lse, lse, q.dtype, q.device, /*required=*/false, totals);
  if (offsets == nullptr) {
    validate_forward_memory(q, k, v, o, lse);
  } else {
    validate_offsets_shape(problem, *offsets, q.device);
    const TensorRef cu_q = offsets_tensor(offsets->cu_seqlens_q);
    const TensorRef cu_k = offsets_tensor(offsets->cu_seqlens_k);
    const TensorRef used = offsets_tensor(offsets->seqused_k);
    validate_no_overlap({{"o", &o, true},
                         {"lse", &lse, true},
                         {"q", &q, false},
                         {"k", &k, false},
                         {"v", &v, false},
                         {"cu_seqlens_q", &cu_q, false},
                         {"cu_seqlens_k", &cu_k, false},
                         {"seqused_k", &used, false}});
  }
  const BackendImpl* impl =
      choose_or_throw(problem, q.dtype, q.device, options.backend, Pass::forward);
  require_tensors(*impl, Pass::forward,
                  {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"lse", &lse}});
  if (offsets == nullptr) {
    impl->forward(ForwardArgs{resolved(problem), q, k, v, o, lse, options});
    return;
  }
  const std::optional<HostOffsets> host = offsets_for(problem, *offsets, q, k, *impl, options);
  const TensorRef no_lse = {};
  impl->forward(ForwardArgs{resolved(problem), batch_of_one(q), batch_of_one(k), batch_of_one(v),
                            batch_of_one(o), lse.data ? batch_of_one(lse) : no_lse, options,
                            *offsets, host ? &*host : nullptr});
}

void run_backward(const Problem& problem, const VarlenOffsets* offsets, const TensorRef& q,
                  const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
                  const TensorRef& dout, const TensorRef& dq, const TensorRef& dk,
                  const TensorRef& dv, const Options& options) {
  require_layout(problem, offsets != nullptr);
  validate_problem(problem);
  validate_tensor(problem, Role::q, q, q.dtype, q.device);
  validate_tensor(problem, Role::k, k, q.dtype, q.device);
  const PackedTotals totals{q.shape[0], k.shape[0]};
  validate_tensor(problem, Role::v, v, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::o, o, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::lse, lse, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::dout, dout, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::dq, dq, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::dk, dk, q.dtype, q.device, true, totals);
  validate_tensor(problem, Role::dv, dv, q.dtype, q.device, true, totals);
  if (offsets == nullptr) {
    validate_backward_memory(q, k, v, o, lse, dout, dq, dk, dv);
  } else {
    validate_offsets_shape(problem, *offsets, q.device);
    const TensorRef cu_q = offsets_tensor(offsets->cu_seqlens_q);
    const TensorRef cu_k = offsets_tensor(offsets->cu_seqlens_k);
    const TensorRef used = offsets_tensor(offsets->seqused_k);
    validate_no_overlap({{"dq", &dq, true},
                         {"dk", &dk, true},
                         {"dv", &dv, true},
                         {"q", &q, false},
                         {"k", &k, false},
                         {"v", &v, false},
                         {"o", &o, false},
                         {"lse", &lse, false},
                         {"do", &dout, false},
                         {"cu_seqlens_q", &cu_q, false},
                         {"cu_seqlens_k", &cu_k, false},
                         {"seqused_k", &used, false}});
  }
  const BackendImpl* impl =
      choose_or_throw(problem, q.dtype, q.device, options.backend, Pass::backward);
  require_tensors(*impl, Pass::backward,
                  {{"q", &q},
                   {"k", &k},
                   {"v", &v},
                   {"o", &o},
                   {"lse", &lse},
                   {"do", &dout},
                   {"dq", &dq},
                   {"dk", &dk},
                   {"dv", &dv}});
  if (offsets == nullptr) {
    impl->backward(BackwardArgs{resolved(problem), q, k, v, o, lse, dout, dq, dk, dv, options});
    return;
  }
  const std::optional<HostOffsets> host = offsets_for(problem, *offsets, q, k, *impl, options);
  impl->backward(BackwardArgs{resolved(problem), batch_of_one(q), batch_of_one(k), batch_of_one(v),
                              batch_of_one(o), batch_of_one(lse), batch_of_one(dout),
                              batch_of_one(dq), batch_of_one(dk), batch_of_one(dv), options,
                              *offsets, host ? &*host : nullptr});
}

}  // namespace
}  // namespace detail

void forward(const Problem& problem, const TensorRef& q, const TensorRef& k, const TensorRef& v,
             const TensorRef& o, const TensorRef& lse, const Options& options) {
  detail::run_forward(problem, nullptr, q, k, v, o, lse, options);
}

void forward(const Problem& problem, const VarlenOffsets& offsets, const TensorRef& q,
             const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
             const Options& options) {
  detail::run_forward(problem, &offsets, q, k, v, o, lse, options);
}

void forward_with_kv_cache(const Problem& problem, const KvCache& cache, const TensorRef& q,
                           const TensorRef& k_new, const TensorRef& v_new, const TensorRef& o,
                           const TensorRef& lse, const Options& options) {
  using namespace detail;
  const int64_t t_new = validate_kv_cache_call(problem, cache, q, k_new, v_new, o, lse);
  const BackendImpl* impl =
      choose_or_throw(problem, q.dtype, q.device, options.backend, Pass::forward);
  require_tensors(*impl, Pass::forward,
                  {{"q", &q},
                   {"k_new", &k_new},
                   {"v_new", &v_new},
                   {"o", &o},
                   {"lse", &lse},
                   {"k_cache", &cache.k},
                   {"v_cache", &cache.v}});
  std::optional<HostKvCache> host;
  if (q.device == Device::cpu || options.check_offsets || impl->needs_host_offsets())
    host = read_and_check_kv_cache(problem, cache, t_new, options.stream);
  impl->forward_kv_cache(KvCacheArgs{resolved(problem), cache, q, k_new, v_new, o, lse, options,
                                     host ? &*host : nullptr});
}

void backward(const Problem& problem, const TensorRef& q, const TensorRef& k, const TensorRef& v,
              const TensorRef& o, const TensorRef& lse, const TensorRef& dout, const TensorRef& dq,
              const TensorRef& dk, const TensorRef& dv, const Options& options) {
  detail::run_backward(problem, nullptr, q, k, v, o, lse, dout, dq, dk, dv, options);
}

void backward(const Problem& problem, const VarlenOffsets& offsets, const TensorRef& q,
              const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
              const TensorRef& dout, const TensorRef& dq, const TensorRef& dk, const TensorRef& dv,
              const Options& options) {
  detail::run_backward(problem, &offsets, q, k, v, o, lse, dout, dq, dk, dv, options);
}

Explanation explain(const Problem& problem, DType dtype, Device device, Backend backend, Pass pass,
                    const Options& options) {
  Explanation out;
  try {
    detail::validate_problem(problem);
  } catch (const Error& e) {
    out.reason = e.argument() + ": " + e.rule();
    return out;
  }
  detail::Choice choice = detail::choose(problem, dtype, device, backend, pass);
  out.supported = choice.impl != nullptr;
  out.chosen = choice.impl ? choice.impl->id() : backend;
  out.reason = choice.reason;
  if (choice.impl != nullptr)
    out.plan = choice.impl->describe_plan(detail::resolved(problem), dtype, pass, options);
  return out;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Cpu: return "cpu";
    case Backend::CpuFlash: return "cpu-flash";
    case Backend::CudaUnfused: return "cuda-unfused";
    case Backend::CudaFlash: return "cuda-flash";
    case Backend::CudaHopper: return "cuda-hopper";
  }
  return "?";
}

std::vector<Backend> all_backends() {
  return {Backend::Cpu, Backend::CpuFlash, Backend::CudaUnfused, Backend::CudaFlash,
          Backend::CudaHopper};
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  for (Backend b : all_backends())
    if (name == backend_name(b)) return b;
  throw Error("backend = '" + name + "'",
              "must be one of auto, cpu, cpu-flash, cuda-unfused, cuda-flash, cuda-hopper");
}

std::vector<BackendStatus> backend_status() {
  std::vector<BackendStatus> out;
  for (Backend b : all_backends()) {
    BackendStatus s;
    s.backend = b;
    std::string reason;
    const detail::BackendImpl* impl = detail::find_backend(b, &reason);
    s.compiled = impl != nullptr;
    if (impl != nullptr) {
      // Available = runs a small, plain problem on its own device.
      Problem probe;
      probe.B = 1;
      probe.Tq = probe.Tk = 128;
      probe.H = probe.Hkv = 1;
      probe.d = 64;
      const Device device =
          b == Backend::Cpu || b == Backend::CpuFlash ? Device::cpu : Device::cuda;
      reason = impl->why_not(probe, DType::bf16, device);
    }
    s.available = s.compiled && reason.empty();
    s.reason = reason;
    out.push_back(s);
  }
  return out;
}

}  // namespace gqattn
