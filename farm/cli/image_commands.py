"""``farm image``: build farm images (default, variants, environments) and list them.

Thin, like the rest of the CLI: it parses, calls ``farm.sandbox.catalog`` and
``farm.sandbox.envspec``, and renders; the rules live there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from farm.judge.languages import OPT_IN

image_app = typer.Typer(help="Farm images: build and list them.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@image_app.command("build")
def image_build(
    name: Annotated[
        str | None,
        typer.Argument(help="farm-sandbox:NAME: default, docs, browser, or an environment's"),
    ] = None,
    pip: list[str] = typer.Option([], "--pip", help="a pip requirement (repeatable)"),
    requirements: list[str] = typer.Option(
        [], "-r", "--requirement", help="a pip requirements file (repeatable)"
    ),
    apt: list[str] = typer.Option([], "--apt", help="a Debian package (repeatable)"),
    from_image: str | None = typer.Option(
        None, "--from", help="start from this local image (it needs python3 >= 3.9)"
    ),
    spec_file: Path | None = typer.Option(
        None, "-f", "--file", help="build the environment a spec file (farm-env.toml) describes"
    ),
    save: Path | None = typer.Option(None, help="also write the spec to this file (TOML)"),
    force: bool = typer.Option(False, help="rebuild without the layer cache"),
    egress: list[str] = typer.Option(
        [],
        "--egress",
        help="a host its boxes may reach, e.g. pypi.org or '*.example.org:443' (repeatable; "
        "within the farm's FARM_EGRESS_ALLOW)",
    ),
    preload: list[str] = typer.Option(
        [],
        "--preload",
        metavar="MODULE",
        help="a module its kernel imports once before forking boxes, e.g. numpy (repeatable)",
    ),
    languages: str = typer.Option(
        "",
        "--languages",
        help="judge only: its languages, comma separated (default: all but the opt-in "
        f"{', '.join(sorted(OPT_IN))})",
    ),
) -> None:
    """Build a farm image when missing or stale: the default one, a variant, or an
    environment (packages added to the sandbox base, or to --from IMAGE)."""
    from farm.errors import DockerUnavailable, ImageBuildError, InvalidRequest
    from farm.image_name import ImageName
    from farm.sandbox.catalog import build_image
    from farm.sandbox.envspec import EnvSpec, load_spec, make_spec, save_spec

    spec: EnvSpec | None = None
    base_dir = Path.cwd()
    given = any((pip, requirements, apt, from_image, egress, preload))  # a spec by options
    try:
        image = ImageName(name) if name is not None else ImageName()
        if spec_file is not None:
            if given:
                fail("give packages either in the spec file or as options, not both", 2)
            spec = load_spec(spec_file, name=name)
            base_dir = spec_file.resolve().parent
        elif given:
            spec = make_spec(
                name=name or "",
                pip=pip,
                requirements=requirements,
                apt=apt,
                egress=egress,
                preload=preload,
                **({"from": from_image} if from_image else {}),
            )
        if save is not None:
            if spec is None:
                fail("--save needs a spec: packages, --from or -f", 2)
            save_spec(spec, save, base_dir=base_dir)
            err.print(f"spec written to {escape(str(save))}")
        built = build_image(
            image,  # a spec names its own
            spec,
            force=force,
            base_dir=base_dir,
            languages=[n.strip() for n in languages.split(",") if n.strip()],
        )
    except InvalidRequest as exc:
        fail(str(exc), 2)
    except (DockerUnavailable, ImageBuildError) as exc:
        fail(str(exc))
    console.print(f"{built.tag} {built.image_id[:19]} {'built' if built.built else 'up to date'}")


@image_app.command("ls")
def image_ls(as_json: bool = typer.Option(False, "--json", help="one JSON object a line")) -> None:
    """Farm images on this Docker host: name, digest, size, spec and kernel."""
    from farm.errors import DockerUnavailable
    from farm.sandbox.catalog import list_images

    try:
        images = list_images()
    except DockerUnavailable as exc:
        fail(str(exc))
    if as_json:
        for image in images:
            print(image.model_dump_json())
        return
    table = Table(title=f"farm images: {len(images)}")
    for column in ("name", "kind", "digest", "size", "kernel", "spec"):
        table.add_column(column)
    for image in images:
        kernel = (image.kernel_hash or "?")[:12]
        if image.kernel_current is not None:
            kernel += " (current)" if image.kernel_current else " [yellow](stale)[/]"
        table.add_row(
            escape(image.name),
            image.kind,
            image.digest.removeprefix("sha256:")[:12],
            f"{image.size_bytes / 1e6:.0f} MB",
            kernel,
            escape(image.spec.summary()) if image.spec else "",
        )
    console.print(table)
