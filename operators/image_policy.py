"""Which images an EnginePool may run. An engine pod gets the release's Redis URL (with its password)
and CURVE key, so a pool that names any image would hand those secrets to code nobody chose: the
operator runs only images from the repositories it was given (`k25 operator --allowed-image`; the
chart passes its own engine images)."""


def repository(image: str) -> str:
    """The image without its tag or digest: registry:5000/team/engine:1.2@sha256:... -> registry:5000/team/engine."""
    name = image.split("@", 1)[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > last_slash else name


def image_refusal(image: str, allowed: tuple[str, ...]) -> str | None:
    """Why `image` may not run, or None. An entry is a repository (any tag or digest of it) or a
    prefix ending in `/*` (every repository under it); no entries: any image."""
    if not allowed:
        return None
    name = repository(image)
    for entry in allowed:
        if name == entry or (entry.endswith("/*") and name.startswith(entry[:-1])):
            return None
    return (f"spec.image {image!r} is not from an allowed repository ({', '.join(allowed)}); "
            "the operator's --allowed-image (the chart's operator.allowedImages) names them")
