#!/usr/bin/env bash
# Reliability checks CI runs after `make test` (docs/reliability.md), from one
# clang build tree (build-sanitize/, override with SANITIZE_DIR) compiled once
# with ASan + UBSan + libFuzzer's coverage instrumentation:
#  1. the server and scheduler unit tests, run directly under ASan + UBSan;
#  2. the fuzz targets, each fuzzed for ROLLPACK_FUZZ_SECONDS (default 20) from
#     its committed seed corpus, two at a time (each is one thread).
# One tree instead of an ASan tree and a fuzz tree: the libraries under test
# are the same, and compiling them twice was a third of CI (docs/build.md).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
SANITIZE_DIR=${SANITIZE_DIR:-build-sanitize}
FUZZ_SECONDS=${ROLLPACK_FUZZ_SECONDS:-20}
start=$(date +%s)

asan_tests=(ndarray_test sample_validation_test sample_store_test durable_log_test bad_input_test
            server_test routing_report_test topology_test plan_test pipeline_layers_test
            layout_test layout_property_test put_samples_reactor_test put_samples_stream_test
            commit_sequencer_test striped_put_test received_microbatch_test send_budget_test
            limits_test microbatch_assembly_test trainer_delivery_test
            recompute_uploads_test sample_validation_mtp_test model_spec_test mtp_test
            engine_exchange_test json_splice_test vllm_response_test sglang_response_test
            captured_sample_test capture_headers_test expert_id_check_test record_budget_test)
fuzzers=(sample_validation_fuzzer topology_fuzzer plan_fuzzer layout_fuzzer received_microbatch_fuzzer
         step_record_fuzzer member_service_fuzzer capture_fuzzer)

# -O1 with line tables only: what ASan's reports need, at a fraction of -O2 -g's
# compile and link time. Debug keeps assertions on.
CC=clang CXX=clang++ cmake -S . -B "$SANITIZE_DIR" -G Ninja -DROLLPACK_FUZZ=ON \
  -DROLLPACK_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
  -DROLLPACK_FUZZ_SECONDS="$FUZZ_SECONDS" >/dev/null
cmake --build "$SANITIZE_DIR" -j "$JOBS" --target "${asan_tests[@]}" "${fuzzers[@]}"
built=$(date +%s)

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${asan_tests[@]}"; do
  echo "== asan+ubsan: $t"
  "$SANITIZE_DIR/bin/$t" --gtest_brief=1
done
tested=$(date +%s)

(cd "$SANITIZE_DIR" && ctest --output-on-failure -j "$JOBS" -L fuzz)
end=$(date +%s)
echo "ci-extra: sanitizer build $((built - start)) s, sanitizer tests $((tested - built)) s," \
  "fuzz runs $((end - tested)) s"
