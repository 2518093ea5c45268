"""Container image references: well formed, and pinned by a tag or a digest, never the moving `latest`.

One rule for the two places that judge an image: a run's `image` in the matrix (generators/matrix/load.py,
at its line) and every container of the repository's manifests (generators/validation/semantics.py).

The grammar is the one container runtimes parse (github.com/distribution/reference, regexp.go):

    reference := name [ ":" tag ] [ "@" digest ]
    name      := [ domain [ ":" port ] "/" ] path-component ( "/" path-component )*   (at most 255 characters)
    path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag       := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
    digest    := algorithm ":" hex, at least 32 hex digits (64 for sha256)

A reference without a tag means `latest` to every runtime, so it is as unpinned as `:latest` itself.
"""

from __future__ import annotations

import re

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
NAME_MAX = 255
EXAMPLE = "registry/repository:1.2.0 or registry/repository@sha256:<64 hex digits>"


def check(image: object) -> tuple[str, str]:
    """(what is wrong, the fix) for an image reference; ("", "") when it is well formed and pinned."""
    if not isinstance(image, str) or not image:
        return "has no image", f"name the image, e.g. {EXAMPLE}"
    match = REFERENCE.fullmatch(image)
    if match is None:
        return f"image {image!r} is not a well-formed image reference", f"write {EXAMPLE}"
    if len(match["name"]) > NAME_MAX:
        return f"image {image} has a repository name longer than {NAME_MAX} characters", "use a shorter one"
    digest = match["digest"]
    if digest is not None:
        algorithm, _, hex_digits = digest.partition(":")
        if algorithm == "sha256" and len(hex_digits) != 64:
            return f"image {image} has a sha256 digest of {len(hex_digits)} hex digits, not 64", "copy the whole digest"
        return "", ""
    if match["tag"] is None:
        return f"image {image} has no tag", "pin it by tag or digest"
    if match["tag"] == "latest":
        return f"image {image} uses the moving tag latest", "pin it by tag or digest"
    return "", ""


def image_problem(image: object) -> str:
    """check() as one phrase for the validator ("" when nothing is wrong)."""
    what, fix = check(image)
    return f"{what}; {fix}" if what and what != "has no image" else what
