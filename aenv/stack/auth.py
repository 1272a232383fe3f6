"""What the embedded servers are told about logins (nats-server's: `natsusers`), Postgres's
pg_hba.conf and the SQL that makes the `aenv` role own its database. Text and SQL only;
`services.py` writes and runs them.

Why at all: the servers listen on 127.0.0.1, which every local user can reach, and the
bus and the read models hold every sandbox's envd token."""

from __future__ import annotations

__all__ = [
    "APP_ROLE",
    "HBA_MARKER",
    "SUPERUSER",
    "hardened_hba",
    "is_hardened",
    "ownership_statements_sql",
    "password_sql",
    "role_sql",
]

#: The login role of the roles and operator commands: owns the database, nothing more.
APP_ROLE = "aenv"
#: initdb's bootstrap superuser: the supervisor's admin login (role, database, ownership).
SUPERUSER = "postgres"
#: First line of a pg_hba.conf this module wrote in its final form.
HBA_MARKER = "# aenv: passwords required (scram-sha-256) on every connection"


def hardened_hba() -> str:
    """Every login needs its password, on the unix socket too (its directory is 0700
    already; the password keeps it so if that mode is ever loosened). Written only once
    the superuser has a password, so the server never starts with trust."""
    return f"{HBA_MARKER}\nlocal all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n"


def is_hardened(hba_text: str) -> bool:
    return hba_text.startswith(HBA_MARKER + "\n")


def role_sql(exists: bool, password: str) -> str:
    """Create the app role, or put an existing one back to exactly these rights: no
    superuser, no CREATEDB/CREATEROLE (it owns one database, it needs no more)."""
    _check_hex(password)
    verb = "ALTER ROLE" if exists else "CREATE ROLE"
    return (
        f"{verb} {APP_ROLE} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
        f"NOREPLICATION NOBYPASSRLS PASSWORD '{password}'"
    )


def password_sql(role: str, password: str) -> str:
    _check_hex(password)
    return f"ALTER ROLE {role} PASSWORD '{password}'"


def _check_hex(password: str) -> None:
    if not password or any(c not in "0123456789abcdef" for c in password):
        raise ValueError("the stack's passwords are hex (they go into SQL literals)")


#: The `ALTER ... OWNER TO aenv` statements for what the superuser owns in the connected
#: database outside the system schemas: schemas, then relations (a table takes its
#: indexes and serial sequences along), then sequences no table owns, types (enums,
#: domains, ranges) and routines. Not `REASSIGN OWNED BY postgres`: Postgres refuses it,
#: the superuser owns the system catalogs too. Objects of extensions stay theirs.
_NOT_SYSTEM = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
_NOT_EXTENSION = (
    "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = '{catalog}'::regclass "
    "AND d.objid = {oid} AND d.deptype = 'e')"
)


def ownership_statements_sql() -> str:
    """One query listing the statements to run, in the order to run them."""
    su = f"(SELECT oid FROM pg_roles WHERE rolname = '{SUPERUSER}')"
    rel_kinds = (
        "CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' "
        "WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END"
    )
    owned_seq = (
        "EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass "
        "AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass "
        "AND d.deptype IN ('a', 'i'))"
    )
    parts = [
        f"SELECT 1, format('ALTER SCHEMA %I OWNER TO {APP_ROLE}', n.nspname) FROM pg_namespace n "
        f"WHERE n.nspowner = {su} AND {_NOT_SYSTEM} "
        f"AND {_NOT_EXTENSION.format(catalog='pg_namespace', oid='n.oid')}",
        f"SELECT 2, format('ALTER %s %I.%I OWNER TO {APP_ROLE}', {rel_kinds}, n.nspname, "
        f"c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE c.relowner = {su} AND {_NOT_SYSTEM} AND c.relkind IN ('r','p','v','m','f','S') "
        f"AND NOT (c.relkind = 'S' AND {owned_seq}) "
        f"AND {_NOT_EXTENSION.format(catalog='pg_class', oid='c.oid')}",
        f"SELECT 3, format('ALTER TYPE %I.%I OWNER TO {APP_ROLE}', n.nspname, t.typname) "
        f"FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        f"WHERE t.typowner = {su} AND {_NOT_SYSTEM} AND t.typtype IN ('e','d','r') "
        f"AND {_NOT_EXTENSION.format(catalog='pg_type', oid='t.oid')}",
        f"SELECT 4, format('ALTER ROUTINE %s OWNER TO {APP_ROLE}', p.oid::regprocedure) "
        f"FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        f"WHERE p.proowner = {su} AND {_NOT_SYSTEM} "
        f"AND {_NOT_EXTENSION.format(catalog='pg_proc', oid='p.oid')}",
    ]
    return " UNION ALL ".join(f"({p})" for p in parts) + " ORDER BY 1"
