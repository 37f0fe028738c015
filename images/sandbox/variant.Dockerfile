# A sandbox image variant (farm-sandbox:docs, farm-sandbox:browser): the default sandbox image
# (images/sandbox/Dockerfile) plus Debian packages and Python wheels. Built by
# `python -m farm.sandbox.variants NAME` (farm/sandbox/variants.py), which picks BASE like the
# default image, puts the wheels in build/sandbox-wheels/NAME/ on the host (a build here
# cannot be trusted to reach PyPI) and labels the image with farm.kernel_hash and
# farm.variant_hash. Build context: build/sandbox-context/NAME/, laid out like the repository
# but holding only this file, farm/kernel/ and the variant's wheels.
#
# The heavy layers (apt, wheels) come first: a kernel change rebuilds only the last layers.
# Containers run like the default image's: read-only root, no network, a uid per session.
ARG BASE=python:3.12-slim
FROM ${BASE}

ARG VARIANT
# Space-separated Debian packages (e.g. "chromium fonts-dejavu-core"); empty: none.
ARG APT_PACKAGES=""

LABEL farm.managed="1" farm.image="sandbox"

RUN mkdir -p /workspace /run/farm /etc/farm && chmod 0711 /workspace && chmod 0700 /run/farm

RUN if [ -n "$APT_PACKAGES" ]; then \
        set -e; \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $APT_PACKAGES; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; \
    fi

# pip runs from its own wheel (Debian's python3 has none), offline, into the system site.
COPY build/sandbox-wheels/${VARIANT}/ /tmp/wheels/
RUN set -e; \
    pip_wheel=$(ls /tmp/wheels/pip-*.whl); \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 "$pip_wheel/pip" install --no-index --no-cache-dir \
        --disable-pip-version-check --root-user-action=ignore --no-warn-script-location \
        $(ls /tmp/wheels/*.whl | grep -v '/pip-'); \
    rm -rf /tmp/wheels

# Browser egress allowlist (hosts, space separated), written to /etc/farm/browser-allow-hosts.
# Empty by default: the browser requests only loopback and workspace files. It does not open
# the sandbox's network (FARM_SANDBOX_NETWORK does): see the README, "Browser". Declared here,
# after the heavy layers, so an allowlisted image shares them.
ARG BROWSER_ALLOW_HOSTS=""
RUN printf '%s\n' $BROWSER_ALLOW_HOSTS > /etc/farm/browser-allow-hosts

# Only the kernel: an empty farm/__init__.py stands in for the real one, which must not be here.
COPY farm/kernel/ /opt/farm/farm/kernel/
RUN touch /opt/farm/farm/__init__.py \
    && find /opt/farm -name '__pycache__' -prune -exec rm -rf {} + \
    && python3 -m compileall -q /opt/farm

# HOME and caches on the /tmp tmpfs: the root is read-only (Chromium writes a profile).
ENV PYTHONPATH=/opt/farm PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp XDG_CACHE_HOME=/tmp/.cache XDG_CONFIG_HOME=/tmp/.config
WORKDIR /workspace

HEALTHCHECK --interval=5s --timeout=3s --start-period=5s \
    CMD ["python3", "-m", "farm.kernel.probe", "/run/farm/kernel.sock"]
ENTRYPOINT ["python3", "-m", "farm.kernel"]
CMD ["--unix", "/run/farm/kernel.sock", "--token-file", "/run/farm/token"]
