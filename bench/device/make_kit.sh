#!/usr/bin/env bash
# Build the GPU box's kit HERE (the box reaches no registry): wheels the box lacks, for its Python 3.12,
# and the Debian packages (bubblewrap for the sandbox, redis for the Celery path). Both folders are
# git-ignored through .git/info/exclude and travel with `carry: [".whl", ".device"]`. The pgserver wheel (11 MB)
# sits apart in .pgkit: only the red team needs it (carry it for `checks`/`redteam`), and with .llama beside
# the tracked files the carry would pass the device's 64 MiB.
#   bash bench/device/make_kit.sh        # then, on the box: bash bench/device/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info .whl .device/deb .pgkit
for p in /.whl/ /.device/ /.pgkit/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
WHEELS="amqp==5.4.2 annotated-types==0.7.0 billiard==4.3.2 celery==5.7.0 click==8.4.0 click-didyoumean==0.3.1
click-plugins==1.1.1.2 click-repl==0.4.1 gguf==0.19.0 kombu==5.7.0 prompt_toolkit==3.0.52 pydantic==2.13.4
pydantic_core==2.46.4 python-dateutil==2.9.0.post0 redis==8.1.0 structlog==26.1.0 typing-inspection==0.4.2
tzlocal==5.4.5 vine==5.1.0 wcwidth==0.7.0 psycopg2-binary==2.9.13"
# pgserver: only for the PostgreSQL binaries it bundles (the red team's database attacks need a real server
# on the box; pending.sh checks starts it as nobody on 127.0.0.1:5432, trust, as this machine has it)
for w in $WHEELS pgserver==0.1.4; do
  dest=.whl; [ "${w%%==*}" = pgserver ] && dest=.pgkit
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d $dest "$w" 2>&1 | grep -v "^WARNING: Location" || true
done
(cd .device/deb && apt-get download bubblewrap redis-server redis-tools libjemalloc2 liblzf1 2>&1 | grep -v "^W:" || true)
du -sh .whl .device .pgkit
