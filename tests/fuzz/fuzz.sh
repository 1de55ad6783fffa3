#!/usr/bin/env bash
# Builds and runs Sluice's libFuzzer targets (tests/fuzz/*_fuzzer.cc).
#
#   fuzz.sh build <fuzz-build-dir>                      configure (clang, -DSLUICE_FUZZ=ON) + build
#   fuzz.sh run <fuzz-build-dir> <target> <seconds>     replay, then fuzz for <seconds>
#   fuzz.sh all <fuzz-build-dir> <seconds>              build, then run every target
#
# `run` first replays every file of tests/fuzz/regressions/<target>/ (each must pass: they are the
# inputs that once crashed, hung or leaked) and of the committed corpus, then fuzzes for <seconds>
# starting from both. New interesting inputs go to <fuzz-build-dir>/work/<target>/corpus (never
# into the committed corpus); a crash is written to <fuzz-build-dir>/work/<target>/crash-* and
# fails the run. Environment: FUZZ_RSS_MB (default 2048), FUZZ_TIMEOUT (per input, default 10 s).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
targets=(cni_input endpoint_protocol k8s_decode)

build() {
  local dir=$1
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  if [[ ! -f $dir/build.ninja ]]; then
    cmake -S "$source_dir" -B "$dir" -G Ninja -DSLUICE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_C_COMPILER=clang "${launcher[@]}" >/dev/null
  fi
  cmake --build "$dir" -- -j"${FUZZ_BUILD_JOBS:-2}"
}

run() {
  local dir=$1 target=$2 seconds=$3
  local bin=$dir/tests/fuzz/${target}_fuzzer
  local work=$dir/work/$target
  local corpus=$here/corpus/$target regressions=$here/regressions/$target
  [[ -x $bin ]] || { echo "fuzz.sh: $bin not built (fuzz.sh build $dir)" >&2; exit 2; }
  mkdir -p "$work/corpus"
  local opts=(-rss_limit_mb="${FUZZ_RSS_MB:-2048}" -timeout="${FUZZ_TIMEOUT:-10}"
              -artifact_prefix="$work/")
  local dict=()
  [[ -f $here/$target.dict ]] && dict=(-dict="$here/$target.dict")

  local replay=()
  [[ -d $regressions ]] && mapfile -t replay < <(find "$regressions" -type f | sort)
  if ((${#replay[@]})); then
    echo "fuzz.sh: $target: replaying ${#replay[@]} regression input(s)"
    "$bin" "${opts[@]}" "${replay[@]}"
  fi
  echo "fuzz.sh: $target: fuzzing for ${seconds}s"
  # -close_fd_mask=3: the targets' own stdout/stderr (sluice-cni prints every failure) would
  # drown libFuzzer's report, which still goes to stderr.
  "$bin" "${opts[@]}" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -close_fd_mask=3 "$work/corpus" "$corpus" ${replay:+"$regressions"}
}

case ${1:-} in
  build) build "$2" ;;
  run) run "$2" "$3" "$4" ;;
  all)
    build "$2"
    failed=()
    for t in "${targets[@]}"; do run "$2" "$t" "$3" || failed+=("$t"); done
    if ((${#failed[@]})); then
      echo "fuzz.sh: failed: ${failed[*]} (inputs in $2/work/<target>/)" >&2
      exit 1
    fi
    ;;
  *)
    sed -n '2,14p' "$0" >&2
    exit 2
    ;;
esac
