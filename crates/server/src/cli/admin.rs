//! `starling admin token …`: admin API tokens (docs/admin.md).

use crate::*;

#[derive(Subcommand)]
pub(crate) enum AdminCommand {
    /// Admin API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token and print it, once: only its SHA-256 is stored.
    /// Example: starling admin token create --name deploy
    Create {
        /// Its name (who uses it): shown in the log line of every change
        /// made with it.
        #[arg(long)]
        name: String,
        /// What it may do: admin (everything) or read (GET requests and
        /// the web page without its forms: monitoring, dashboards).
        #[arg(long, default_value = "admin", value_parser = ["admin", "read"])]
        scope: String,
    },
    /// List the tokens: name, scope, created, last used (never the tokens).
    List,
    /// Revoke a token; requests using it are refused at once.
    Revoke {
        /// Its name.
        name: String,
    },
}

/// `admin token …`.
pub(crate) async fn admin_token(cfg: Config, cmd: TokenCommand) -> anyhow::Result<()> {
    use starling_server::admin::tokens;
    let storage = open_storage(&cfg).await?;
    let store = storage.admin_tokens.as_ref();
    let result = async {
        match cmd {
            TokenCommand::Create { name, scope } => {
                let token = tokens::create(store, &name, &scope).await?;
                note!(
                    "created admin token {name:?} (scope {scope}); it is shown only now: keep it secret (e.g. export STARLING_ADMIN_TOKEN=…)"
                );
                out!("{token}")?;
            }
            TokenCommand::List => {
                let list = tokens::list(store).await?;
                if list.is_empty() {
                    note!("no admin tokens; create one with: starling admin token create --name NAME");
                }
                let when = |ms: i64| {
                    starling_proto::datetime::xep0082_datetime(u128::try_from(ms).unwrap_or(0))
                };
                for t in &list {
                    out!(
                        "{}  scope {}  created {}  last used {}",
                        t.name,
                        t.scope,
                        when(t.created_at),
                        t.last_used_at.map_or("never".to_owned(), when)
                    )?;
                }
            }
            TokenCommand::Revoke { name } => {
                if store.revoke_admin_token(&name).await? {
                    out!("revoked admin token {name:?}")?;
                } else {
                    bail!("no admin token named {name:?} (see `starling admin token list`)");
                }
            }
        }
        Ok(())
    }
    .await;
    storage.backend.close().await;
    result
}
