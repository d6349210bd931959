//! Service discovery declarations (XEP-0030), filled by modules at start-up.
//!
//! No hand-kept feature list exists anywhere: a feature is advertised only
//! because the module that implements it is enabled and declared it here.

use crate::hooks::IqScope;

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
    /// Declares a feature var for `scope`.
    pub fn feature(&mut self, scope: IqScope, var: &str) -> &mut Self {
        let list = match scope {
            IqScope::Server => &mut self.server_features,
            IqScope::Account => &mut self.account_features,
        };
        if !list.iter().any(|f| f == var) {
            list.push(var.to_owned());
            list.sort();
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
