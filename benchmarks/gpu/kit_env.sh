# Sourced (bash) by check.sh and in_kit.sh: installs the kit's wheels (without dependencies, beside the
# Python's own packages: the device image's torch) and pflbench from this tree, laid out as installed,
# into $WORK/site, and exports the environment that runs pflbench from there. Needs REPO, KIT, PY, WORK.
SITE="$WORK/site"
kit_start=$(date +%s)
# (the rehearsal's own Python finds its wheels in .gpu-rehearsal-wheels/, made by kit.py, which never travels)
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --find-links "$KIT/wheels" \
    $( [ -d "$REPO/.gpu-rehearsal-wheels" ] && echo --find-links "$REPO/.gpu-rehearsal-wheels" ) \
    --target "$SITE" -r "$REPO/benchmarks/gpu/kit-requirements.txt" || { echo "installing the kit failed" >&2; exit 2; }
# pflbench from this tree, laid out as installed (pyproject.toml: benchmarks/ is the data package pflbench.benchmarks)
mkdir -p "$SITE/pflbench" "$SITE/pflbench-0.1.0.dist-info"
cp -r "$REPO/pflbench/." "$SITE/pflbench/"
cp -r "$REPO/benchmarks" "$SITE/pflbench/benchmarks"
printf 'Metadata-Version: 2.1\nName: pflbench\nVersion: 0.1.0\n' > "$SITE/pflbench-0.1.0.dist-info/METADATA"
echo "kit installed in $(( $(date +%s) - kit_start )) s" >&2
# The site first; the current folder never on sys.path (it holds pflbench/ without its benchmarks data)
export PYTHONPATH="$SITE" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PFLBENCH_DATA_MIRROR="$KIT/data" PFLBENCH_DATA="$WORK/data"
