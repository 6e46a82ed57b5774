"""A small, deliberate public-suffix list: the suffixes a `*.suffix` host wildcard must not be.

Not the whole Public Suffix List (https://publicsuffix.org, ~9,000 entries that change weekly):
the lint needs to catch a policy author writing `*.com`, `*.co.uk` or `*.github.io`, so this
ships the ICANN top-level and second-level suffixes in common use and the private suffixes
where anyone can obtain a subdomain (hosting and tunnelling services). A `*.suffix` whose
suffix is a single label is always treated as public (every TLD is a public suffix).
"""

from __future__ import annotations

_SECOND_LEVEL = """
ac.uk co.uk gov.uk ltd.uk me.uk net.uk nhs.uk org.uk plc.uk police.uk sch.uk
com.au net.au org.au edu.au gov.au asn.au id.au
co.nz net.nz org.nz govt.nz ac.nz geek.nz school.nz
co.jp ne.jp or.jp ac.jp go.jp ed.jp gr.jp lg.jp
com.br net.br org.br gov.br edu.br
com.cn net.cn org.cn gov.cn edu.cn ac.cn
com.hk net.hk org.hk edu.hk gov.hk
com.tw net.tw org.tw edu.tw gov.tw
co.in net.in org.in firm.in gen.in ind.in ac.in edu.in gov.in
co.kr ne.kr or.kr ac.kr go.kr
com.mx net.mx org.mx gob.mx edu.mx
co.za net.za org.za gov.za ac.za web.za
com.ar net.ar org.ar gob.ar edu.ar
com.tr net.tr org.tr gov.tr edu.tr
com.sg net.sg org.sg edu.sg gov.sg
com.my net.my org.my edu.my gov.my
co.id or.id ac.id go.id web.id
com.ua net.ua org.ua gov.ua edu.ua in.ua
co.il org.il net.il ac.il gov.il
com.pl net.pl org.pl
co.at or.at ac.at gv.at
com.es org.es nom.es edu.es gob.es
com.pt org.pt edu.pt gov.pt
com.ru net.ru org.ru pp.ru msk.ru spb.ru
co.th in.th or.th ac.th go.th
com.vn net.vn org.vn edu.vn gov.vn
com.ph net.ph org.ph edu.ph gov.ph
com.pk net.pk org.pk edu.pk gov.pk
com.ng org.ng edu.ng gov.ng
co.ke or.ke ac.ke go.ke
com.eg org.eg edu.eg gov.eg
com.sa net.sa org.sa edu.sa gov.sa
co.ae net.ae org.ae ac.ae gov.ae
com.co net.co org.co edu.co gov.co
com.pe net.pe org.pe edu.pe gob.pe
com.cl
"""

_PRIVATE = """
github.io gitlab.io bitbucket.io pages.dev workers.dev herokuapp.com herokussl.com
vercel.app now.sh netlify.app netlify.com web.app firebaseapp.com appspot.com
blogspot.com wordpress.com azurewebsites.net azurestaticapps.net cloudapp.net
trafficmanager.net cloudfront.net s3.amazonaws.com elasticbeanstalk.com amplifyapp.com
ngrok.io ngrok.app ngrok-free.app ngrok.dev trycloudflare.com loca.lt
glitch.me repl.co replit.dev fly.dev onrender.com railway.app deno.dev
surge.sh readthedocs.io gitbook.io notion.site webflow.io wixsite.com
myshopify.com dyndns.org duckdns.org no-ip.org ddns.net
"""

SECOND_LEVEL: frozenset[str] = frozenset(_SECOND_LEVEL.split())
PRIVATE: frozenset[str] = frozenset(_PRIVATE.split())


def public_suffix(suffix: str) -> str | None:
    """Why ``suffix`` (canonical, no leading ``*.``) is public, or ``None`` if it is not."""
    if "." not in suffix:
        return "a top-level domain"
    if suffix in SECOND_LEVEL:
        return "a public suffix"
    if suffix in PRIVATE:
        return "a hosting suffix where anyone can get a subdomain"
    return None
