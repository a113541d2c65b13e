"""`k25 api-key`: make a new API key and the hashed entry to put in the gateway's keys file."""

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("api-key", help="make an API key for a tenant", description=__doc__)
    p.add_argument("--tenant", required=True, help="the tenant this key belongs to")
    p.add_argument("--admin", action="store_true",
                   help="the key may list, show and delete every tenant's stored documents")
    p.set_defaults(handler=run)


def run(args) -> int:
    from services.gateway.api_keys import hash_key, new_key

    if not args.tenant.strip():
        raise SystemExit("k25 api-key: --tenant must not be empty")
    key = new_key()
    print(f"key (give it to the client; it is not stored): {key}")
    print("entry for the keys file's \"keys\" list:")
    print(json.dumps({"sha256": hash_key(key), "tenant": args.tenant} | ({"admin": True} if args.admin else {})))
    return 0
