-- +goose Up
-- Two foreign keys were checked twice on every write: each is implied by a
-- composite key of the same row whose columns are all NOT NULL, and whose
-- target references the same parent in turn. Each cost a trigger, a query
-- and a row lock per row written, and guarded nothing the other did not.
--
-- An entry's memory: (memory_id, revision) references memory_revisions,
-- whose memory_id references memories. This rests on
-- memory_revisions_memory_id_fkey; dropping that would need this back.
ALTER TABLE thread_entries DROP CONSTRAINT thread_entries_memory_id_fkey;
-- A claim's task: (task_id, version) references task_versions, whose
-- task_id references tasks. This rests on task_versions_task_id_fkey.
ALTER TABLE claims DROP CONSTRAINT claims_task_id_fkey;

-- +goose Down
ALTER TABLE claims ADD CONSTRAINT claims_task_id_fkey
    FOREIGN KEY (task_id) REFERENCES tasks (id);
ALTER TABLE thread_entries ADD CONSTRAINT thread_entries_memory_id_fkey
    FOREIGN KEY (memory_id) REFERENCES memories (id);
