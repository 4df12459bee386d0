-- Each `send` re-arms a delivery with the next generation. Delivery messages
-- carry the generation they were made for, so the retries and outcomes of an
-- older one can be told apart and dropped instead of overwriting the state.
ALTER TABLE deliveries ADD COLUMN generation integer NOT NULL DEFAULT 0;
