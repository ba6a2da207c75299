"""The status page's one stylesheet, and the Content-Security-Policy that admits it alone.

Why inline and hashed: the page must work offline with no second request (no CDN, no file
to serve) and run no script, so the policy is `default-src 'none'` and the only style it
admits is this one, by its SHA-256. Any other style, script, image, frame or form target
the page might be made to carry is refused by the browser. The charts' SVG is styled by
this sheet too (svg_chart's classes), so the dark scheme restyles them.
"""

from __future__ import annotations

import base64
import hashlib

STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--muted:#57606a;--line:#d0d7de;
--card:#f6f8fa;--ok:#1a7f37;--warning:#9a6700;--critical:#cf222e;--unknown:#6e40c9;
--grid:#d0d7de;--axis:#57606a;--link:#0550ae}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9da7b3;
--line:#30363d;--card:#161b22;--ok:#3fb950;--warning:#d29922;--critical:#f85149;
--unknown:#a371f7;--grid:#30363d;--axis:#9da7b3;--link:#79c0ff}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif}
header,main,footer{max-width:72rem;margin:0 auto;padding:0 1rem}
h1{font-size:1.4rem;margin:1rem 0 .25rem;overflow-wrap:anywhere}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem;border-bottom:1px solid var(--line)}
h3{font-size:1rem;margin:0 0 .5rem;overflow-wrap:anywhere}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.15rem .75rem;margin:0}
dt{color:var(--muted)}
dd{margin:0;overflow-wrap:anywhere}
code{font:13px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,22rem),1fr));
gap:1rem}
.gpu{background:var(--card);border:1px solid var(--line);border-left:.4rem solid var(--ok);
border-radius:.4rem;padding:.75rem;min-width:0}
.gpu[data-state=warning]{border-left-color:var(--warning)}
.gpu[data-state=critical]{border-left-color:var(--critical)}
.gpu[data-state=unknown]{border-left-color:var(--unknown)}
.badge{display:inline-block;padding:0 .4rem;border-radius:.3rem;font-weight:600;
font-size:.8rem;text-transform:uppercase;border:1px solid currentColor}
.s-ok{color:var(--ok)}.s-warning{color:var(--warning)}.s-critical{color:var(--critical)}
.s-unknown{color:var(--unknown)}
.findings{list-style:none;padding:0;margin:.5rem 0 0}
.finding{border-top:1px solid var(--line);padding:.4rem 0;overflow-wrap:anywhere}
.finding p{margin:.15rem 0}
.fix,.action{color:var(--muted)}
#freshness{margin:.25rem 0 .5rem}
.reload{margin:.5rem 0 0;font-size:.85rem;color:var(--muted)}
a{color:var(--link)}
#freshness[data-state=stale],#freshness[data-state=none]{color:var(--critical);font-weight:600}
.table-wrap{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{text-align:left;vertical-align:top;padding:.25rem .5rem .25rem 0;
border-bottom:1px solid var(--line);overflow-wrap:anywhere}
th{color:var(--muted);font-weight:600}
@media (max-width:40rem){thead{position:absolute;width:1px;height:1px;overflow:hidden;
clip:rect(0 0 0 0)}tr{display:block;border-bottom:1px solid var(--line);padding:.25rem 0}
td{display:grid;grid-template-columns:6.5rem minmax(0,1fr);border:0;padding:.1rem 0}
td::before{content:attr(data-label);color:var(--muted)}}
figure{margin:.5rem 0}
figcaption{color:var(--muted);font-size:.8rem}
svg{width:100%;height:auto;display:block}
svg text{fill:var(--fg)}
svg .background{fill:var(--card)}
svg .limit{stroke:var(--muted)}
svg .grid,svg .grid line{stroke:var(--grid)}
svg .plot{fill:none;stroke:var(--line)}
footer{color:var(--muted);font-size:.85rem;margin:2rem auto 1rem}
""".strip()

STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()

CSP = (f"default-src 'none'; style-src 'sha256-{STYLE_HASH}'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")

# Every answer of `/`: the policy, and nothing the browser may guess or send on
HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
