"""mkdocs hook: links from a docs page to repository files outside docs/ are checked.

The pages link to the code they describe with relative paths (``../examples/own_loop.py``),
which GitHub follows as they are. mkdocs sees only ``docs/``, so such a link would be a
"not found" warning. Here a link whose target exists in the repository becomes a link to
``repo_url`` (``mkdocs.yml``) when one is set, else the path in code font; a link to a file
that does not exist fails the build, as a broken page link does.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

LINK = re.compile(r"(!?)\[([^\]]*)\]\(((?:\.\./)+[^)#\s]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def repl(match: re.Match[str]) -> str:
        bang, label, target, anchor = match.groups()
        path = (here / target).resolve()
        if path == docs or docs in path.parents:
            return match.group(0)                  # a page of the site: mkdocs checks it
        if root not in path.parents or not path.exists():
            raise PluginError(f"{page.file.src_path}: the link {target} names no file "
                              f"of the repository")
        relative = path.relative_to(root).as_posix()
        if repo_url:
            return f"{bang}[{label}]({repo_url}/blob/main/{relative}{anchor or ''})"
        if label.strip("`") == relative or bang:
            return f"`{relative}`"
        return f"{label} (`{relative}`)"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):           # links inside code blocks are text
        parts.append(LINK.sub(repl, markdown[last:fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(repl, markdown[last:]))
    return "".join(parts)


ROLE = re.compile(r":(?:py:)?(?:meth|class|func|data|attr|mod|exc|obj):(?=<code>)")
TILDE = re.compile(r"<code>~\.?([\w.]*?)([\w]+)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The docstrings cite code in Sphinx's roles (``:class:`~amptrain.x.Y```); the site
    shows them as code, without the role, and ``~``-shortened names as their last part."""
    if not page.file.src_path.startswith("api/"):      # only the generated reference
        return html
    html = ROLE.sub("", html)
    return TILDE.sub(r"<code>\2</code>", html)
