//! Service discovery declarations (XEP-0030), filled by modules at start-up.
//!
//! No hand-kept feature list exists anywhere: a feature is advertised only
//! because the module that implements it is enabled and declared it here.
//!
//! A module declares each feature for the JIDs where clients look for it
//! ([`Scopes`]): the server's domain, the account's bare JID, or both. A
//! service the server offers each account (an archive, an inbox) belongs on
//! the account per its XEP and is usually declared on the server too,
//! because clients ask the server (Prosody, ejabberd and MongooseIM do the
//! same).

use crate::hooks::IqScope;

/// The disco#info scopes a feature is declared in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scopes {
    server: bool,
    account: bool,
}

impl Scopes {
    /// The server's domain only.
    pub const SERVER: Scopes = Scopes {
        server: true,
        account: false,
    };
    /// Accounts' bare JIDs only.
    pub const ACCOUNT: Scopes = Scopes {
        server: false,
        account: true,
    };
    /// Both the server's domain and accounts' bare JIDs.
    pub const BOTH: Scopes = Scopes {
        server: true,
        account: true,
    };

    /// True if `scope` is one of these scopes.
    pub fn contains(self, scope: IqScope) -> bool {
        match scope {
            IqScope::Server => self.server,
            IqScope::Account => self.account,
        }
    }
}

impl From<IqScope> for Scopes {
    fn from(scope: IqScope) -> Scopes {
        match scope {
            IqScope::Server => Scopes::SERVER,
            IqScope::Account => Scopes::ACCOUNT,
        }
    }
}

/// An identity (XEP-0030 §3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The identity category, e.g. `server`.
    pub category: String,
    /// The identity type, e.g. `im`.
    pub kind: String,
    /// A human-readable name.
    pub name: Option<String>,
}

/// Features and identities per scope.
#[derive(Default, Debug)]
pub struct DiscoRegistry {
    server_features: Vec<String>,
    account_features: Vec<String>,
    server_identities: Vec<Identity>,
    account_identities: Vec<Identity>,
}

impl DiscoRegistry {
    /// Declares a feature var for `scopes` (an [`IqScope`] or [`Scopes`]).
    pub fn feature(&mut self, scopes: impl Into<Scopes>, var: &str) -> &mut Self {
        let scopes = scopes.into();
        for scope in [IqScope::Server, IqScope::Account] {
            if !scopes.contains(scope) {
                continue;
            }
            let list = match scope {
                IqScope::Server => &mut self.server_features,
                IqScope::Account => &mut self.account_features,
            };
            if !list.iter().any(|f| f == var) {
                list.push(var.to_owned());
                list.sort();
            }
        }
        self
    }

    /// Declares an identity for `scope`.
    pub fn identity(
        &mut self,
        scope: IqScope,
        category: &str,
        kind: &str,
        name: Option<&str>,
    ) -> &mut Self {
        let id = Identity {
            category: category.to_owned(),
            kind: kind.to_owned(),
            name: name.map(str::to_owned),
        };
        let list = match scope {
            IqScope::Server => &mut self.server_identities,
            IqScope::Account => &mut self.account_identities,
        };
        if !list.contains(&id) {
            list.push(id);
        }
        self
    }

    /// Features declared for `scope`, sorted.
    pub fn features(&self, scope: IqScope) -> &[String] {
        match scope {
            IqScope::Server => &self.server_features,
            IqScope::Account => &self.account_features,
        }
    }

    /// Identities declared for `scope`.
    pub fn identities(&self, scope: IqScope) -> &[Identity] {
        match scope {
            IqScope::Server => &self.server_identities,
            IqScope::Account => &self.account_identities,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_declared_in_both_scopes_listed_in_each_once() {
        let mut d = DiscoRegistry::default();
        d.feature(Scopes::BOTH, "urn:b")
            .feature(IqScope::Account, "urn:a")
            .feature(Scopes::SERVER, "urn:b");
        assert_eq!(d.features(IqScope::Server), ["urn:b"]);
        assert_eq!(d.features(IqScope::Account), ["urn:a", "urn:b"]);
    }
}
