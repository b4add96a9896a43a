-- Past one primary: a bulk job made through an API serving several
-- partitions is one job in each partition's store, each acting on its own
-- orders. The first partition's keeps the id the API answers with; every
-- other partition's names it as its origin, so the API finds them all by
-- that id and reports them as one.
ALTER TABLE bulk_jobs ADD COLUMN origin bigint UNIQUE;
