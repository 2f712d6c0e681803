#!/usr/bin/env bash
# Reliability checks CI runs after `make test` (docs/reliability.md):
#  1. ASan+UBSan build of the server and scheduler unit tests, run directly;
#  2. clang/libFuzzer build of the fuzz targets, each fuzzed for
#     ROLLPACK_FUZZ_SECONDS (default 20) from its committed seed corpus.
# Build trees: build-asan/ and build-fuzz/ (override with ASAN_DIR, FUZZ_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
ASAN_DIR=${ASAN_DIR:-build-asan}
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
FUZZ_SECONDS=${ROLLPACK_FUZZ_SECONDS:-20}
start=$(date +%s)

asan_tests=(ndarray_test sample_validation_test sample_store_test durable_log_test bad_input_test
            server_test routing_report_test topology_test plan_test pipeline_layers_test
            layout_test layout_property_test put_samples_reactor_test put_samples_stream_test
            commit_sequencer_test striped_put_test received_microbatch_test send_budget_test
            limits_test microbatch_assembly_test trainer_delivery_test
            recompute_uploads_test sample_validation_mtp_test model_spec_test mtp_test)
cmake -S . -B "$ASAN_DIR" -G Ninja -DROLLPACK_SANITIZE=ON -DROLLPACK_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 >/dev/null
cmake --build "$ASAN_DIR" -j "$JOBS" --target "${asan_tests[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${asan_tests[@]}"; do
  echo "== asan+ubsan: $t"
  "$ASAN_DIR/bin/$t" --gtest_brief=1
done
asan_done=$(date +%s)

CC=clang CXX=clang++ cmake -S . -B "$FUZZ_DIR" -G Ninja -DROLLPACK_FUZZ=ON -DROLLPACK_WITH_CUDA=OFF \
  -DROLLPACK_FUZZ_SECONDS="$FUZZ_SECONDS" >/dev/null
cmake --build "$FUZZ_DIR" -j "$JOBS" --target sample_validation_fuzzer topology_fuzzer plan_fuzzer layout_fuzzer \
  received_microbatch_fuzzer
(cd "$FUZZ_DIR" && ctest --output-on-failure -L fuzz)
end=$(date +%s)
echo "ci-extra: sanitizer build + tests $((asan_done - start)) s, fuzz build + runs $((end - asan_done)) s"
