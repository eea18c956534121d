--------------------------------------------------------------------------------
-- cycle: roles given the work part by 0.2.0 (they execute complete_many) get the
-- part again, which now holds complete_and_claim and heartbeat_many.
--------------------------------------------------------------------------------
SELECT treadle._grant_parts(a.grantee::regrole, ARRAY['work'])
  FROM pg_catalog.pg_proc AS p
 CROSS JOIN aclexplode(p.proacl) AS a
 WHERE p.oid = 'treadle.complete_many(bigint[], uuid[], jsonb[])'::regprocedure
   AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> p.proowner
   AND a.grantee <> 0;
