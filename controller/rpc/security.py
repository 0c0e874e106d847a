"""rasd-controller's security flags: mutual TLS files, dev certificates, bearer tokens, plaintext role.

Default (no flag): mutual TLS with the files cert-manager writes into the mounted Secret
(``/etc/rasd/tls/{ca.crt,tls.crt,tls.key}``). ``--dev-certs DIR`` makes (or reuses) a throwaway
CA under DIR with ``rasd.common.devcerts`` and serves its controller certificate: the loopback demo.
``--insecure`` serves plaintext, on a loopback address only (checked in ``main``).
"""

from __future__ import annotations

import argparse
import pathlib

from rasd.common import devcerts, tls
from rasd.controller.rpc import authn

TLS_DIR = pathlib.Path("/etc/rasd/tls")
"""Where the chart mounts the TLS Secret (cert-manager's key names: ca.crt, tls.crt, tls.key)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The security flags of rasd-controller."""
    group = parser.add_argument_group("security (README, 'Certificates')")
    group.add_argument("--tls-ca", type=pathlib.Path, default=TLS_DIR / "ca.crt", help="CA of agent and operator certs")
    group.add_argument("--tls-cert", type=pathlib.Path, default=TLS_DIR / "tls.crt", help="server certificate")
    group.add_argument("--tls-key", type=pathlib.Path, default=TLS_DIR / "tls.key", help="its private key")
    group.add_argument(
        "--dev-certs",
        type=pathlib.Path,
        metavar="DIR",
        help="make (or reuse) a throwaway dev CA and certificates under DIR and serve them (loopback demo)",
    )
    group.add_argument(
        "--tokens-file", type=pathlib.Path, help="bearer tokens for rasctl: NAME ROLE sha256:HEX per line"
    )
    group.add_argument(
        "--insecure-role",
        choices=("viewer", "operator", "admin", "none"),
        default="admin",
        help="with --insecure: the role of callers without credentials (default %(default)s; none denies them)",
    )


def settings_from_args(args: argparse.Namespace) -> authn.SecuritySettings:
    """SecuritySettings from the parsed flags; files are checked now so a bad one stops start-up.

    Raises:
        ValueError, OSError: a flag combination or file is wrong; the message names it.
    """
    tokens_file = args.tokens_file
    if tokens_file is not None:
        authn.TokenStore(tokens_file)  # validates every line now
    insecure_role = None if args.insecure_role == "none" else authn.Role.parse(args.insecure_role)
    if args.insecure:
        if args.dev_certs is not None:
            raise ValueError("--insecure and --dev-certs exclude each other")
        return authn.SecuritySettings(tls=None, tokens_file=tokens_file, insecure_role=insecure_role)
    if args.dev_certs is not None:
        pki = devcerts.init(args.dev_certs, [])
        files = tls.TlsFiles(ca=pki.ca.cert, cert=pki.controller.cert, key=pki.controller.key)
    else:
        files = tls.TlsFiles(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    try:
        files.read()
    except OSError as exc:
        raise ValueError(
            f"TLS: {exc.filename}: {exc.strerror} (set --tls-ca/--tls-cert/--tls-key, --dev-certs DIR for a "
            "loopback demo, or --insecure for plaintext on loopback)"
        ) from None
    return authn.SecuritySettings(
        tls=files,
        tokens_file=tokens_file,
        insecure_role=insecure_role,
    )
