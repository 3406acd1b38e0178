"""MkDocs hook: links from a page to files of the repository outside ``docs/`` (records, plans, benchmarks).

The guides link to the records that produced their figures (``../experiments/records/PLAN/results.md``), which
read well on the repository host. MkDocs validates relative links against ``docs/`` only, so it would report
each of them as missing. This hook checks them itself — a target that is not a file of the repository is a
warning, which fails ``mkdocs build --strict`` — and points them at the file on the repository host when
``repo_url`` is set, or else at a copy placed in the built site under ``repo/``.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.repo_links")

# A markdown link or image target: ](path) or ](path#anchor), without a scheme.
_LINK = re.compile(r"\]\((?P<path>[^)\s#:]+)(?P<anchor>#[^)\s]*)?\)")
_SCHEME = "repo-file:"  # a scheme, so that MkDocs leaves the link alone until on_page_content rewrites it
_HREF = re.compile(r'(?P<attr>href|src)="' + _SCHEME + r'(?P<path>[^"#]*)(?P<anchor>#[^"]*)?"')
_copied: set[str] = set()


def _roots(config) -> tuple[Path, Path]:
    """(the docs folder, the repository root: the folder of mkdocs.yml)."""
    return Path(config["docs_dir"]).resolve(), Path(config["config_file_path"]).resolve().parent


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links that leave ``docs/``: checked against the repository, then marked for :func:`on_page_content`."""
    docs, root = _roots(config)
    folder = (docs / page.file.src_uri).parent

    def mark(match: re.Match) -> str:
        target = (folder / match["path"]).resolve()
        if target.is_relative_to(docs):
            return match[0]  # inside docs/: MkDocs validates it
        if not target.is_relative_to(root) or not target.is_file():
            log.warning("Doc file '%s' contains a link to '%s', which is not a file of the repository.",
                        page.file.src_uri, match["path"])
            return match[0]
        path = target.relative_to(root).as_posix()
        _copied.add(path)
        return f"]({_SCHEME}{path}{match['anchor'] or ''})"

    return _LINK.sub(mark, markdown)


def on_page_content(html: str, page, config, files) -> str:
    """The marked links, pointed at the repository host (``repo_url``) or at the site's copy under ``repo/``."""
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def point(match: re.Match) -> str:
        path, anchor = match["path"], match["anchor"] or ""
        url = f"{repo_url}/blob/HEAD/{path}" if repo_url else get_relative_url(f"repo/{path}", page.url)
        return f'{match["attr"]}="{url}{anchor}"'

    return _HREF.sub(point, html)


def on_post_build(config) -> None:
    """Copy the linked repository files into the site (when there is no ``repo_url`` to link to)."""
    if config.get("repo_url"):
        return
    _, root = _roots(config)
    site = Path(config["site_dir"])
    for path in sorted(_copied):
        (site / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / path, site / "repo" / path)
