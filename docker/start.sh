#!/bin/sh
# Entry point of the worker image. Serves the model baked at build time
# (BAKED_MODEL_DIR, described by the baked.env that bake_model.py wrote)
# unless the endpoint names another model, then runs the worker:
# python -m handler.
#
#  - the embedded default model was baked and MODEL_NAME is unset: the worker
#    finds it in the cache under BAKED_MODEL_DIR (XDG_CACHE_HOME points there);
#  - a named model was baked and MODEL_NAME is unset or names it: MODEL_NAME
#    becomes the baked folder and the OpenAI routes report the baked name;
#  - either way HF_HUB_OFFLINE=1: nothing is downloaded at start;
#  - any other MODEL_NAME loads from a Hugging Face cache that already holds it
#    (RunPod's cached models, the network volume), offline, else from the hub
#    into the Hugging Face cache under BASE_PATH, so later cold starts reuse it.
set -eu

baked=${BAKED_MODEL_DIR:-/models/baked}

say() { echo "start.sh: $*" >&2; }

name=${MODEL_NAME:-}
revision=${MODEL_REVISION:-}
elsewhere="cached under ${BASE_PATH:-the default Hugging Face cache}"

if [ -f "$baked/baked.env" ]; then
    BAKED_MODEL_NAME='' BAKED_MODEL_REVISION='' BAKED_QUANTIZATION='' BAKED_MODEL_LABEL='' BAKED_MODEL_PATH=''
    # shellcheck disable=SC1091  # written at build time by bake_model.py
    . "$baked/baked.env"
    if [ -z "$BAKED_MODEL_NAME" ] && [ -z "$name" ]; then
        export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$baked/cache}"
        export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
        say "serving the baked default model ${BAKED_MODEL_LABEL} (HF_HUB_OFFLINE=$HF_HUB_OFFLINE)"
    elif [ -n "$BAKED_MODEL_NAME" ] && { [ -z "$name" ] || { [ "$name" = "$BAKED_MODEL_NAME" ] \
            && { [ -z "$revision" ] || [ "$revision" = "$BAKED_MODEL_REVISION" ]; }; }; }; then
        export MODEL_NAME="$baked/$BAKED_MODEL_PATH"
        unset MODEL_REVISION
        if [ -n "$BAKED_QUANTIZATION" ] && [ -z "${QUANTIZATION:-}" ]; then
            export QUANTIZATION="$BAKED_QUANTIZATION"
        fi
        export OPENAI_SERVED_MODEL_NAME_OVERRIDE="${OPENAI_SERVED_MODEL_NAME_OVERRIDE:-$BAKED_MODEL_LABEL}"
        export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
        say "serving the baked model ${BAKED_MODEL_LABEL} from $MODEL_NAME (HF_HUB_OFFLINE=$HF_HUB_OFFLINE)"
    else
        say "MODEL_NAME=${name:-(unset: the default model)}${revision:+@$revision} is not the baked model (${BAKED_MODEL_LABEL}); it loads from a cache that holds it, else from the hub, $elsewhere"
    fi
else
    say "no baked model in $baked; ${name:-the default model} loads $elsewhere"
fi

exec "${PYTHON:-python}" -m handler "$@"
