#include "loader/skeleton.h"

#include <bpf/btf.h>

#include <atomic>

namespace sluice::loader {
namespace {

std::atomic<bool> force_no_kern_ctx{false};

bool ProbeKernCtx() {
  struct btf* vmlinux = btf__load_vmlinux_btf();
  if (vmlinux == nullptr) {
    spdlog::info("datapath: no kernel BTF; the TC programs update L4 checksums through the helper");
    return false;
  }
  const bool found = btf__find_by_name_kind(vmlinux, "bpf_cast_to_kern_ctx", BTF_KIND_FUNC) > 0;
  btf__free(vmlinux);
  if (found) {
    spdlog::info("datapath: the TC programs read the skb's checksum state (bpf_cast_to_kern_ctx)");
  } else {
    spdlog::info(
        "datapath: the kernel has no bpf_cast_to_kern_ctx (Linux < 6.2); the TC programs update "
        "L4 checksums through the helper");
  }
  return found;
}

}  // namespace

bool UseKernCtx() {
  static const bool kernel_has_it = ProbeKernCtx();
  return kernel_has_it && !force_no_kern_ctx.load();
}

void ForceNoKernCtxForTesting(bool force) { force_no_kern_ctx.store(force); }

}  // namespace sluice::loader
