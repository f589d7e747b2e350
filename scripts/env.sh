# Shared settings for the scripts: where builds and the Python test venv live.
# Sourced, not run. Both live outside the checkout when possible so repeated runs (and CI on
# the same machine) reuse them; every script still works from an empty cache.
: "${CARGO_TARGET_DIR:=/var/tmp/kvindex-target}"
: "${KVINDEX_VENV:=/var/tmp/kvindex-venv}"
: "${KVINDEX_FIXTURES:=/var/tmp/kvindex-fixtures}"
export CARGO_TARGET_DIR KVINDEX_VENV KVINDEX_FIXTURES
export KVINDEX_PYTHON="$KVINDEX_VENV/bin/python"
# The system RocksDB the `rocksdb` crate links (Debian's librocksdb-dev; .cargo/config.toml
# sets the same default for plain cargo commands).
: "${ROCKSDB_LIB_DIR:=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)}"
export ROCKSDB_LIB_DIR
