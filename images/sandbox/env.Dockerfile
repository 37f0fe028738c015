# A farm environment (farm-sandbox:NAME): the variants docs and browser, and the environments
# `farm image build NAME` makes. The default sandbox image (images/sandbox/Dockerfile) plus
# Debian packages and Python wheels, on the sandbox base or on any image with python3 (BASE).
# Built by farm/sandbox/environments.py, which picks BASE, puts the wheels the host downloaded
# in the build context (a build here cannot be trusted to reach PyPI) and labels the image with
# farm.kernel_hash and farm.env_hash. Build context: build/sandbox-context/NAME/, holding this
# file, farm/kernel/ and wheels/.
#
# The heavy layers (apt, wheels) come first: a kernel change rebuilds only the last layers.
# Containers run like the default image's: read-only root, no network, a uid per session.
ARG BASE=python:3.12-slim
FROM ${BASE}

# Space-separated Debian packages (names checked by farm.sandbox.envspec); empty: none.
ARG APT_PACKAGES=""

LABEL farm.managed="1" farm.image="sandbox"
# A base of the user's may end as another user; building needs root.
USER root

# The kernel starts as root (of the container, with five capabilities: farm/sandbox/docker.py)
# and runs every session as a uid of its own; no user account is needed for that.
RUN mkdir -p /workspace /run/farm /etc/farm && chmod 0711 /workspace && chmod 0700 /run/farm

RUN set -e; \
    if [ -n "$APT_PACKAGES" ]; then \
        if ! command -v apt-get >/dev/null; then \
            echo "farm: apt packages need a Debian-based image; this one has no apt-get"; \
            exit 1; \
        fi; \
        apt-get -o Acquire::Retries=3 update; \
        DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=3 install -y \
            --no-install-recommends $APT_PACKAGES; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; \
    fi

# pip runs from its own wheel (Debian's python3 has none), offline, into the system site.
COPY wheels/ /tmp/wheels/
RUN set -e; \
    if ls /tmp/wheels/*.whl >/dev/null 2>&1; then \
        pip_wheel=$(ls /tmp/wheels/pip-*.whl); \
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 "$pip_wheel/pip" install --no-index --no-cache-dir \
            --disable-pip-version-check --root-user-action=ignore --no-warn-script-location \
            $(ls /tmp/wheels/*.whl | grep -v '/pip-'); \
    fi; \
    rm -rf /tmp/wheels

# Judge toolchains (farm/judge/languages.py): the Debian packages of the languages the image
# judges, in a layer of their own (after the spec's, so other images keep their layers), with
# the man directory Debian's JDK scripts expect and the base image leaves out. The language
# table (compile, run and version commands) goes to /etc/farm/judge/languages.json.
ARG JUDGE_APT_PACKAGES=""
RUN set -e; \
    if [ -n "$JUDGE_APT_PACKAGES" ]; then \
        mkdir -p /usr/share/man/man1; \
        apt-get -o Acquire::Retries=3 update; \
        DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=3 install -y \
            --no-install-recommends $JUDGE_APT_PACKAGES; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; \
    fi
COPY judge/ /etc/farm/judge/

# Only the kernel: an empty farm/__init__.py stands in for the real one, which must not be here.
COPY farm/kernel/ /opt/farm/farm/kernel/
RUN touch /opt/farm/farm/__init__.py \
    && find /opt/farm -name '__pycache__' -prune -exec rm -rf {} + \
    && python3 -m compileall -q /opt/farm
# Each judged language's version, asked of the toolchain once, here (farm/kernel/judge/language_table.py).
RUN PYTHONPATH=/opt/farm python3 -m farm.kernel.judge.language_table /etc/farm/judge/languages.json

# HOME, TMPDIR and the XDG caches are each session's own (set by the kernel per box).
ENV PYTHONPATH=/opt/farm PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /workspace

HEALTHCHECK --interval=5s --timeout=3s --start-period=5s \
    CMD ["python3", "-m", "farm.kernel.wire.probe", "/run/farm/kernel.sock"]
ENTRYPOINT ["python3", "-m", "farm.kernel"]
CMD ["--unix", "/run/farm/kernel.sock", "--token-file", "/run/farm/token"]
