#!/usr/bin/env bash
# On the GPU box: the kit into the system site (the sandbox scrubs PYTHONPATH, so no --target), bubblewrap
# to /, redis under /opt/redisx with wrappers on PATH. Idempotent.
set -e
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
  $(ls .pgkit/*.whl 2>/dev/null) 2>&1 | grep -vi warning || true  # .pgkit: carried for the red team only
dpkg -x .device/deb/bubblewrap_*.deb /
mkdir -p /opt/redisx /var/tmp/tgcache
for f in .device/deb/redis-*.deb .device/deb/libjemalloc2_*.deb .device/deb/liblzf1_*.deb; do dpkg -x "$f" /opt/redisx; done
for b in redis-server redis-cli; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/redisx/usr/lib/x86_64-linux-gnu exec /opt/redisx/usr/bin/%s "$@"\n' "$b" \
    > /usr/local/bin/$b
  chmod +x /usr/local/bin/$b
done
echo "kit: $(bwrap --version), $(redis-server --version | cut -d' ' -f1-3)"
