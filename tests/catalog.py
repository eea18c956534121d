"""A snapshot of everything schema treadle defines, read from the catalog, and a diff of two.

Two installs are the same when their snapshots are equal: an upgraded database and a
fresh one, or a plain-SQL install and the extension. A snapshot holds definitions only,
never rows or sequence values, and names roles relative to the schema's owner
(`<owner>`), so installs made by different roles compare equal when they grant alike.

    snapshot(conn)                      -> {category: {object: description}}
    snapshot(conn, extension=False)     the same without the extension's own catalog
                                        (its members and its config tables)
    describe_difference(a, b, "a", "b") -> "" when equal, else a readable diff
"""

from __future__ import annotations

import difflib

import psycopg

Snapshot = dict[str, dict[str, str]]

# ACL entries, one line each, with the owner written as <owner> and the public as PUBLIC.
# A null ACL means the default one, so both forms of the same rights compare equal.
_ACL = """
    coalesce((SELECT string_agg(e.entry, '; ' ORDER BY e.entry)
                FROM (SELECT format('%%s: %%s%%s by %%s',
                                    CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                         WHEN a.grantee = {owner} THEN '<owner>'
                                         ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
                                    a.privilege_type,
                                    CASE WHEN a.is_grantable THEN ' (grantable)' ELSE '' END,
                                    CASE WHEN a.grantor = {owner} THEN '<owner>'
                                         ELSE pg_catalog.pg_get_userbyid(a.grantor) END) AS entry
                        FROM pg_catalog.aclexplode({acl}) AS a) AS e), 'none')
"""


def _acl(acl: str, owner: str, default_kind: str | None) -> str:
    """The SQL text of an owner-relative ACL of `acl` (null -> acldefault(default_kind))."""
    if default_kind is not None:
        acl = f"coalesce({acl}, pg_catalog.acldefault('{default_kind}', {owner}))"
    return _ACL.format(acl=acl, owner=owner)


def _owner(owner: str) -> str:
    """'<owner>' when an object belongs to the schema's owner, else the role's name."""
    return f"CASE WHEN {owner} = s.nspowner THEN '<owner>' ELSE pg_catalog.pg_get_userbyid({owner}) END"


# Each query returns (object, description) rows for the schema named by %(schema)s;
# `s` is that schema's pg_namespace row.
_SCHEMA = "FROM pg_catalog.pg_namespace AS s WHERE s.nspname = %(schema)s"

QUERIES: dict[str, str] = {
    "schema": f"""
        SELECT s.nspname::text,
               concat_ws(E'\\n',
                   'grants: ' || {_acl("s.nspacl", "s.nspowner", "n")},
                   'comment: ' || pg_catalog.obj_description(s.oid, 'pg_namespace'))
        {_SCHEMA}""",
    "functions": f"""
        SELECT p.oid::regprocedure::text,
               concat_ws(E'\\n',
                   pg_catalog.pg_get_functiondef(p.oid),
                   'kind: ' || p.prokind::text, 'language: ' || l.lanname,
                   'volatility: ' || p.provolatile::text, 'security definer: ' || p.prosecdef,
                   'strict: ' || p.proisstrict, 'leakproof: ' || p.proleakproof,
                   'parallel: ' || p.proparallel::text, 'rows: ' || p.prorows, 'cost: ' || p.procost,
                   'config: ' || coalesce(array_to_string(p.proconfig, ', '), 'none'),
                   'owner: ' || {_owner("p.proowner")},
                   'grants: ' || {_acl("p.proacl", "s.nspowner", "f")},
                   'comment: ' || pg_catalog.obj_description(p.oid, 'pg_proc'))
        FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_namespace AS s ON s.oid = p.pronamespace
        JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
        WHERE s.nspname = %(schema)s""",
    # tables, views and the like, with their columns in order
    "relations": f"""
        SELECT c.relname::text,
               concat_ws(E'\\n',
                   'kind: ' || c.relkind::text, 'persistence: ' || c.relpersistence::text,
                   'options: ' || coalesce(array_to_string(c.reloptions, ', '), 'none'),
                   'row level security: ' || c.relrowsecurity || ', forced: ' || c.relforcerowsecurity,
                   'replica identity: ' || c.relreplident::text,
                   'owner: ' || {_owner("c.relowner")},
                   'grants: ' || {_acl("c.relacl", "s.nspowner", "r")},
                   'comment: ' || pg_catalog.obj_description(c.oid, 'pg_class'),
                   'definition: ' || pg_catalog.pg_get_viewdef(c.oid, true),
                   (SELECT string_agg(concat_ws(' ',
                               'column', quote_ident(a.attname), pg_catalog.format_type(a.atttypid, a.atttypmod),
                               CASE WHEN a.attnotnull THEN 'not null' END,
                               CASE WHEN a.attidentity <> '' THEN 'identity ' || a.attidentity::text END,
                               CASE WHEN a.attgenerated <> '' THEN 'generated ' || a.attgenerated::text END,
                               'default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid),
                               CASE WHEN a.attcollation <> t.typcollation
                                    THEN 'collate ' || a.attcollation::regcollation::text END,
                               CASE WHEN a.attacl IS NOT NULL
                                    THEN 'grants ' || {_acl("a.attacl", "s.nspowner", None)} END,
                               'comment ' || pg_catalog.col_description(c.oid, a.attnum)),
                               E'\\n' ORDER BY a.attnum)
                      FROM pg_catalog.pg_attribute AS a
                      JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
                      LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped))
        FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_namespace AS s ON s.oid = c.relnamespace
        WHERE s.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')""",
    "constraints": """
        SELECT coalesce(r.relname || '.', '') || co.conname,
               concat_ws(E'\\n', 'type: ' || co.contype::text, pg_catalog.pg_get_constraintdef(co.oid, true),
                         'comment: ' || pg_catalog.obj_description(co.oid, 'pg_constraint'))
        FROM pg_catalog.pg_constraint AS co
        JOIN pg_catalog.pg_namespace AS s ON s.oid = co.connamespace
        LEFT JOIN pg_catalog.pg_class AS r ON r.oid = co.conrelid
        WHERE s.nspname = %(schema)s""",
    "indexes": """
        SELECT c.relname::text,
               concat_ws(E'\\n', pg_catalog.pg_get_indexdef(c.oid),
                         'comment: ' || pg_catalog.obj_description(c.oid, 'pg_class'))
        FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_namespace AS s ON s.oid = c.relnamespace
        WHERE s.nspname = %(schema)s AND c.relkind IN ('i', 'I')""",
    "sequences": f"""
        SELECT c.relname::text,
               concat_ws(E'\\n',
                   format('%%s start %%s increment %%s min %%s max %%s cache %%s cycle %%s',
                          q.seqtypid::regtype, q.seqstart, q.seqincrement, q.seqmin, q.seqmax,
                          q.seqcache, q.seqcycle),
                   'owned by: ' || (SELECT string_agg(d.refobjid::regclass || '.' || a.attname
                                                      || ' (' || d.deptype::text || ')', ', ')
                                      FROM pg_catalog.pg_depend AS d
                                      JOIN pg_catalog.pg_attribute AS a
                                        ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                     WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                       AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')),
                   'owner: ' || {_owner("c.relowner")},
                   'grants: ' || {_acl("c.relacl", "s.nspowner", "s")},
                   'comment: ' || pg_catalog.obj_description(c.oid, 'pg_class'))
        FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_namespace AS s ON s.oid = c.relnamespace
        JOIN pg_catalog.pg_sequence AS q ON q.seqrelid = c.oid
        WHERE s.nspname = %(schema)s""",
    "policies": """
        SELECT r.relname || '.' || p.polname,
               concat_ws(E'\\n',
                   'command: ' || p.polcmd::text, 'permissive: ' || p.polpermissive,
                   'roles: ' || (SELECT string_agg(pr.name, ', ' ORDER BY pr.name)
                                   FROM (SELECT CASE WHEN x = 0 THEN 'PUBLIC'
                                                     WHEN x = s.nspowner THEN '<owner>'
                                                     ELSE pg_catalog.pg_get_userbyid(x) END AS name
                                           FROM unnest(p.polroles) AS x) AS pr),
                   'using: ' || pg_catalog.pg_get_expr(p.polqual, p.polrelid),
                   'with check: ' || pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid),
                   'comment: ' || pg_catalog.obj_description(p.oid, 'pg_policy'))
        FROM pg_catalog.pg_policy AS p
        JOIN pg_catalog.pg_class AS r ON r.oid = p.polrelid
        JOIN pg_catalog.pg_namespace AS s ON s.oid = r.relnamespace
        WHERE s.nspname = %(schema)s""",
    "statistics": """
        SELECT x.stxname::text,
               concat_ws(E'\\n', pg_catalog.pg_get_statisticsobjdef(x.oid),
                         'target: ' || x.stxstattarget,
                         'comment: ' || pg_catalog.obj_description(x.oid, 'pg_statistic_ext'))
        FROM pg_catalog.pg_statistic_ext AS x
        JOIN pg_catalog.pg_namespace AS s ON s.oid = x.stxnamespace
        WHERE s.nspname = %(schema)s""",
    "triggers": """
        SELECT r.relname || '.' || t.tgname,
               concat_ws(E'\\n', pg_catalog.pg_get_triggerdef(t.oid, true), 'enabled: ' || t.tgenabled::text,
                         'comment: ' || pg_catalog.obj_description(t.oid, 'pg_trigger'))
        FROM pg_catalog.pg_trigger AS t
        JOIN pg_catalog.pg_class AS r ON r.oid = t.tgrelid
        JOIN pg_catalog.pg_namespace AS s ON s.oid = r.relnamespace
        WHERE s.nspname = %(schema)s AND NOT t.tgisinternal""",
    # types of their own (enums, domains, composite types that are not a table's row type)
    "types": f"""
        SELECT t.oid::regtype::text,
               concat_ws(E'\\n',
                   'type: ' || t.typtype::text,
                   'base: ' || CASE WHEN t.typtype = 'd' THEN pg_catalog.format_type(t.typbasetype, t.typtypmod) END,
                   'not null: ' || t.typnotnull, 'default: ' || t.typdefault,
                   'labels: ' || (SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                                    FROM pg_catalog.pg_enum AS e WHERE e.enumtypid = t.oid),
                   'checks: ' || (SELECT string_agg(pg_catalog.pg_get_constraintdef(k.oid), '; ' ORDER BY k.conname)
                                    FROM pg_catalog.pg_constraint AS k WHERE k.contypid = t.oid),
                   'owner: ' || {_owner("t.typowner")},
                   'grants: ' || {_acl("t.typacl", "s.nspowner", "T")},
                   'comment: ' || pg_catalog.obj_description(t.oid, 'pg_type'))
        FROM pg_catalog.pg_type AS t
        JOIN pg_catalog.pg_namespace AS s ON s.oid = t.typnamespace
        WHERE s.nspname = %(schema)s AND t.typelem = 0 AND t.typtype <> 'b'
          AND (t.typrelid = 0 OR (SELECT relkind FROM pg_catalog.pg_class WHERE oid = t.typrelid) = 'c')""",
    "default privileges": f"""
        SELECT pg_catalog.pg_get_userbyid(d.defaclrole) || ' ' || d.defaclobjtype::text,
               {_acl("d.defaclacl", "s.nspowner", None)}
        FROM pg_catalog.pg_default_acl AS d
        JOIN pg_catalog.pg_namespace AS s ON s.oid = d.defaclnamespace
        WHERE s.nspname = %(schema)s""",
}

# What only an extension has: the objects it owns, and the tables pg_dump keeps rows of.
EXTENSION_QUERIES: dict[str, str] = {
    "extension members": """
        SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid), 'member'
        FROM pg_catalog.pg_depend AS d
        JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid
        WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = %(extension)s""",
    "extension config": """
        SELECT c.cfg::regclass::text, 'condition: ' || coalesce(e.extcondition[c.n], 'none')
        FROM pg_catalog.pg_extension AS e,
             unnest(e.extconfig) WITH ORDINALITY AS c (cfg, n)
        WHERE e.extname = %(extension)s""",
    # objects in the schema that are not the extension's (a migration that forgot one)
    "objects outside the extension": """
        SELECT pg_catalog.pg_describe_object(o.classid, o.objid, 0), 'not a member'
        FROM (SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_catalog.pg_class AS c
               WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind NOT IN ('i', 'I', 't')
              UNION ALL
              SELECT 'pg_proc'::regclass, p.oid FROM pg_catalog.pg_proc AS p
               WHERE p.pronamespace = %(schema)s::regnamespace) AS o
        WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                           WHERE d.classid = o.classid AND d.objid = o.objid AND d.deptype IN ('e', 'a', 'i'))""",
}


def snapshot(
    conn: psycopg.Connection, schema: str = "treadle", extension: bool = True, name: str = "treadle"
) -> Snapshot:
    """The definitions of everything in `schema`; with `extension`, also its extension's catalog."""
    queries = QUERIES | (EXTENSION_QUERIES if extension else {})
    taken: Snapshot = {}
    for category, query in queries.items():
        rows = conn.execute(query, {"schema": schema, "extension": name}).fetchall()
        taken[category] = {str(key): str(description) for key, description in rows}
    return taken


def describe_difference(a: Snapshot, b: Snapshot, a_name: str, b_name: str) -> str:
    """A unified diff, category by category, of what differs; "" when the snapshots are equal."""
    parts: list[str] = []
    for category in sorted(a.keys() | b.keys()):
        left, right = a.get(category, {}), b.get(category, {})
        for key in sorted(left.keys() | right.keys()):
            if left.get(key) == right.get(key):
                continue
            if key not in right:
                parts.append(f"--- {category} {key}: only in {a_name}\n" + _indent(left[key], "- "))
            elif key not in left:
                parts.append(f"+++ {category} {key}: only in {b_name}\n" + _indent(right[key], "+ "))
            else:
                diff = difflib.unified_diff(
                    left[key].splitlines(),
                    right[key].splitlines(),
                    f"{a_name}: {category} {key}",
                    f"{b_name}: {category} {key}",
                    lineterm="",
                    n=2,
                )
                parts.append("\n".join(diff))
    return "\n".join(parts)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
