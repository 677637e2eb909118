# Sourced by the analyses/ experiment scripts before they train: records whose numbers go into docs/
# must come from a committed tree (run.json names the commit; `+dirty` when geolens/, analyses/ or pyproject.toml differed from it).
# Refuses (exit 2) when geolens/, analyses/ or pyproject.toml differ from HEAD; ALLOW_DIRTY=1 overrides.
# Sweep workers and later runs of a long script import the code as it is when they start: commit,
# then leave the tree alone (or run the script from a clone of the commit) until the runs are done.
require_clean_tree() {
    local changed
    changed=$(git status --porcelain -- geolens analyses pyproject.toml 2>/dev/null) || {
        echo "not a git checkout: records would name no commit; run from a clone of the repository (ALLOW_DIRTY=1 overrides)" >&2; exit 2; }
    if [ -n "$changed" ] && [ "${ALLOW_DIRTY:-0}" != 1 ]; then
        echo "uncommitted changes in geolens/, analyses/ or pyproject.toml ($(echo "$changed" | wc -l) files): commit them first, or set ALLOW_DIRTY=1 to train records marked +dirty" >&2
        exit 2
    fi
}
