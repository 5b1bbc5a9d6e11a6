# One image for every tokengate process (web, publish worker, gpu workers, migrations).
# No secrets are baked in: they arrive at run time through env files and mounted secret files.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git bubblewrap ca-certificates linux-libc-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY worker ./worker
COPY runtime ./runtime
COPY templates ./templates
COPY migrations ./migrations
RUN pip install --no-cache-dir .

# The package is installed, but templates/ and migrations/ are read from /app.
ENV PYTHONUNBUFFERED=1 PYTHONPATH=/app
RUN useradd --create-home --uid 10001 tokengate
# The GPU worker needs, from the container runtime (worker/sandbox, README "Security"): user namespaces
# (docker-compose.yml's gpu workers run with docker/gpu-worker-seccomp.json, apparmor and systempaths
# unconfined, no capabilities, never privileged), a writable delegated cgroup v2 subtree (private cgroup
# namespace) with memory and pids enabled, and bubblewrap (installed above). Without them evaluations are
# INFRA sandbox_unavailable.
USER tokengate
EXPOSE 8000
CMD ["tokengate", "serve", "--port", "8000"]
