"""`dpch users add|list|remove`: the gateway's analysts (argon2id hashes in DIR/users.json).

    printf '%s\\n' "$PASSWORD" | dpch users add alice --password-stdin [--data-dir DIR]
    dpch users list [--data-dir DIR]
    dpch users remove alice [--data-dir DIR]

A running gateway picks changes up on the next request. Give each user a budget with
``dpch budget set --data-dir DIR --analyst NAME --dataset db.table --epsilon E``.
"""
from __future__ import annotations

import getpass
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("users", help="manage the gateway's users (dpch serve)")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    sub = p.add_subparsers(dest="users_command", metavar="ACTION")

    def common(sp):
        sp.add_argument("--data-dir", default=None, help="data directory (default $DPCH_DATA_DIR or ./.dpch_data)")

    a = sub.add_parser("add", help="add a user (or change a password with --replace)")
    a.add_argument("name")
    a.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    a.add_argument("--replace", action="store_true", help="replace an existing user's password")
    common(a)
    a.set_defaults(func=_add)
    ls = sub.add_parser("list", help="list users")
    common(ls)
    ls.set_defaults(func=_list)
    r = sub.add_parser("remove", help="remove a user")
    r.add_argument("name")
    common(r)
    r.set_defaults(func=_remove)


def _store(args):
    from ..config import default_data_dir
    from ..users import UserStore

    return UserStore(Path(args.data_dir) if args.data_dir else default_data_dir())


def _add(args) -> int:
    if args.password_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("dpch: error: the passwords differ", file=sys.stderr)
            return 2
    _store(args).add(args.name, password, replace=args.replace)
    print(f"user {args.name} {'updated' if args.replace else 'added'}")
    return 0


def _list(args) -> int:
    names = _store(args).list()
    print("\n".join(names) if names else "no users")
    return 0


def _remove(args) -> int:
    _store(args).remove(args.name)
    print(f"user {args.name} removed")
    return 0
