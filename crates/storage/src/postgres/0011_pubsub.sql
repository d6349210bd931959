-- Publish-subscribe (XEP-0060) and PEP (XEP-0163) in one set of tables:
-- `service` is an account's bare JID (PEP) or a pubsub service's domain.
-- The node row is the parent of every other row of the node: the items,
-- subscriptions and affiliations of a node are written only while it
-- exists (checked in the writer's transaction, the node row locked on
-- PostgreSQL) and deleted with it in one transaction (no foreign keys,
-- as for MUC rooms). `config` and subscription `options` are the pubsub
-- module's own serializations, stored verbatim.
CREATE TABLE pubsub_nodes (
    service    TEXT COLLATE "C" NOT NULL,
    node       TEXT COLLATE "C" NOT NULL,
    config     TEXT   NOT NULL,
    created_at BIGINT NOT NULL, -- milliseconds since the Unix epoch
    PRIMARY KEY (service, node)
);

-- Published items: the XML of the payload (empty for notification-only
-- nodes) and the module's publication order `seq` (larger is newer;
-- republishing an id replaces the row and its seq). Read newest first
-- per node (`pubsub_items_by_seq`: listings, trimming to max_items, the
-- last item of every node at login); `item_id` breaks ties of seq.
CREATE TABLE pubsub_items (
    service   TEXT COLLATE "C" NOT NULL,
    node      TEXT COLLATE "C" NOT NULL,
    item_id   TEXT COLLATE "C" NOT NULL,
    publisher TEXT   NOT NULL,
    payload   TEXT   NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (service, node, item_id)
);
CREATE INDEX pubsub_items_by_seq ON pubsub_items (service, node, seq, item_id);

-- Subscriptions (XEP-0060 §6.1): a JID (bare or full, as given) may hold
-- several, told apart by subid. `state` is subscribed, pending or
-- unconfigured. Looked up by (jid, service): a JID's subscriptions on a
-- service, and account deletion (the bare JID and every `bare/…` full JID
-- of the account, on any service: a range of this index).
CREATE TABLE pubsub_subscriptions (
    service TEXT COLLATE "C" NOT NULL,
    node    TEXT COLLATE "C" NOT NULL,
    jid     TEXT COLLATE "C" NOT NULL,
    subid   TEXT COLLATE "C" NOT NULL,
    state   TEXT NOT NULL,
    options TEXT NOT NULL, -- empty: the defaults
    PRIMARY KEY (service, node, jid, subid)
);
CREATE INDEX pubsub_subscriptions_by_jid ON pubsub_subscriptions (jid, service);

-- Affiliations (XEP-0060 §4.1: owner, publisher, publish-only, member,
-- outcast; `none` is no row), the node's owner among them. Looked up by
-- (jid, service) as subscriptions are.
CREATE TABLE pubsub_affiliations (
    service     TEXT COLLATE "C" NOT NULL,
    node        TEXT COLLATE "C" NOT NULL,
    jid         TEXT COLLATE "C" NOT NULL,
    affiliation TEXT NOT NULL,
    PRIMARY KEY (service, node, jid)
);
CREATE INDEX pubsub_affiliations_by_jid ON pubsub_affiliations (jid, service);
