# kvgate gateway image: small, non-root, `kvgate serve` as the entry point.
#
#   docker build -t kvgate:0.1.0 .                              # the gateway (+ KV events)
#   docker build --build-arg EXTRAS=kvevents,sim -t kvgate:0.1.0-sim .   # + simulator/bench/demo
#   docker build --build-arg EXTRAS=kvevents,llamacpp,sim ...   # + real llama.cpp workers
#   (kvevents: pyzmq and msgspec, for workers' kv_events; tokenizer: tokenizers, fastokens and jinja2)
#
# BASE is any Debian-like image with Python >= 3.11 (python3 and python3-venv).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG EXTRAS="kvevents"
# pip reads these from the environment: a build behind a TLS-intercepting proxy or a
# mirror passes them (e.g. --build-arg PIP_CERT=/ca.crt with the CA mounted there).
ARG PIP_CERT
ARG PIP_INDEX_URL
RUN python3 -m venv /opt/kvgate
COPY pyproject.toml README.md LICENSE /src/
COPY src /src/src
RUN /opt/kvgate/bin/pip install --no-cache-dir --no-compile "/src${EXTRAS:+[$EXTRAS]}" \
 && /opt/kvgate/bin/python -m compileall -q /opt/kvgate/lib

FROM ${BASE}
COPY --from=build /opt/kvgate /opt/kvgate
# A fixed numeric uid so Kubernetes' runAsNonRoot can check it without /etc/passwd.
RUN groupadd --system --gid 10001 kvgate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin kvgate \
 && mkdir -p /etc/kvgate
COPY deploy/base/kvgate.yaml /etc/kvgate/kvgate.yaml
ENV PATH=/opt/kvgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8000
# Liveness of the process only (as Kubernetes' livenessProbe); readiness is /readyz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["kvgate", "serve"]
CMD ["--config", "/etc/kvgate/kvgate.yaml"]
