//! `starling cluster status`: the cluster's nodes as a running node sees them (docs/cluster.md).

use crate::*;

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// List the nodes of the cluster, their sessions and their last
    /// heartbeat, as heard on the NATS bus of [cluster] nats_url (it listens
    /// for three heartbeat intervals; sends nothing). Exit code 0 when at
    /// least one node answered, 1 otherwise.
    /// Example: starling --config /etc/starling.toml cluster status
    Status {
        /// One JSON object per node, in an array (for scripts).
        #[arg(long)]
        json: bool,
    },
}

/// `cluster …`.
pub(crate) async fn cluster(cfg: Config, cmd: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Status { json } = cmd;
    let Some(url) = cfg.cluster.nats_url.clone() else {
        bail!("no cluster configured: set [cluster] nats_url in the file given with --config (docs/cluster.md)");
    };
    let listen = std::time::Duration::from_millis(3 * cfg.cluster.heartbeat_ms.max(100) + 200);
    if !json && std::io::stderr().is_terminal() {
        note!("listening on {url} for {:.1} s…", listen.as_secs_f64());
    }
    let nodes = starling_server::cluster::observe(&cfg.cluster, listen).await?;
    if json {
        out!("{}", serde_json::to_string_pretty(&nodes)?)?;
    } else {
        out!(
            "cluster {:?} on {url}: {} node(s)",
            cfg.cluster.name,
            nodes.len()
        )?;
        if !nodes.is_empty() {
            out!(
                "{:>4}  {:>9}  {:>15}  {:>15}  incarnation",
                "node",
                "sessions",
                "registry events",
                "last heartbeat"
            )?;
        }
        for n in &nodes {
            out!(
                "{:>4}  {:>9}  {:>15}  {:>12} ms  {}",
                n.node,
                n.sessions,
                n.registry_events,
                n.last_heartbeat_ms_ago,
                n.incarnation
            )?;
        }
    }
    if nodes.is_empty() {
        bail!(
            "no node of cluster {:?} was heard on {url} within {:.1} s: are the nodes running with the same [cluster] name?",
            cfg.cluster.name,
            listen.as_secs_f64()
        );
    }
    Ok(())
}
