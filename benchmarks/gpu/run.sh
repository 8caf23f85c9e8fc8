#!/usr/bin/env bash
# The one prepared command of the accelerator benchmark kit (benchmarks/gpu/README.md).
#
#   bash benchmarks/gpu/run.sh              # on the bare, offline accelerator machine: under 8 minutes on one H200
#   bash benchmarks/gpu/run.sh --cpu-smoke  # the same parts, tiny, on this machine's CPU (about 2 minutes)
#   bash benchmarks/gpu/run.sh --parts dpsgd,finetune --budget 500   # some parts (kit.py's flags)
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
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) smoke=(--cpu-smoke) ;;
    --parts|--budget)
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
      kit_args+=("$1" "$2"); shift ;;
    *) echo "run.sh: unknown argument '$1' (options: --cpu-smoke, --parts P,Q, --budget SECONDS)" >&2; exit 2 ;;
  esac
  shift
done
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
"$python" benchmarks/gpu/kit.py --out "$out" "${smoke[@]}" "${kit_args[@]}"
