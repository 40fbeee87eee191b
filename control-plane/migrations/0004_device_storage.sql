-- What a device last reported of its disk, quotas and archive export (JSON of StorageStatus).
-- Portable SQL, as 0001.
ALTER TABLE devices ADD COLUMN storage_json TEXT;
