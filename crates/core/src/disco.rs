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

/// Who declared a feature or identity: the bits of the modules that did
/// ([`crate::module::module_bit`]), or always shown when something outside
/// any module's start declared it.
#[derive(Clone, Copy, Debug, Default)]
struct Declarers {
    bits: u64,
    always: bool,
}

impl Declarers {
    fn add(&mut self, bit: u64) {
        if bit == 0 {
            self.always = true;
        }
        self.bits |= bit;
    }

    /// Shown unless every module that declared it is switched off.
    fn shown(self, off: u64) -> bool {
        self.always || self.bits & !off != 0
    }
}

/// Features and identities per scope, each with the modules that declared
/// it, so a domain that switches modules off shows only the others'.
#[derive(Default, Debug)]
pub struct DiscoRegistry {
    server_features: Vec<(String, Declarers)>,
    account_features: Vec<(String, Declarers)>,
    server_identities: Vec<(Identity, Declarers)>,
    account_identities: Vec<(Identity, Declarers)>,
    /// The bit of the module being started (set by
    /// [`crate::hooks::HookRegistry::begin_module`]).
    pub(crate) current_bit: u64,
}

impl DiscoRegistry {
    /// Declares a feature var for `scopes` (an [`IqScope`] or [`Scopes`]).
    pub fn feature(&mut self, scopes: impl Into<Scopes>, var: &str) -> &mut Self {
        let scopes = scopes.into();
        let bit = self.current_bit;
        for scope in [IqScope::Server, IqScope::Account] {
            if !scopes.contains(scope) {
                continue;
            }
            let list = match scope {
                IqScope::Server => &mut self.server_features,
                IqScope::Account => &mut self.account_features,
            };
            match list.iter_mut().find(|(f, _)| f == var) {
                Some((_, d)) => d.add(bit),
                None => {
                    let mut d = Declarers::default();
                    d.add(bit);
                    list.push((var.to_owned(), d));
                    list.sort_by(|a, b| a.0.cmp(&b.0));
                }
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
        let bit = self.current_bit;
        let list = match scope {
            IqScope::Server => &mut self.server_identities,
            IqScope::Account => &mut self.account_identities,
        };
        match list.iter_mut().find(|(i, _)| *i == id) {
            Some((_, d)) => d.add(bit),
            None => {
                let mut d = Declarers::default();
                d.add(bit);
                list.push((id, d));
            }
        }
        self
    }

    /// Features declared for `scope`, sorted, without those only modules
    /// switched off in `off` declared (a domain's
    /// [`crate::Host::modules_off`]; 0: all).
    pub fn features(&self, scope: IqScope, off: u64) -> impl Iterator<Item = &str> {
        let list = match scope {
            IqScope::Server => &self.server_features,
            IqScope::Account => &self.account_features,
        };
        list.iter()
            .filter(move |(_, d)| d.shown(off))
            .map(|(f, _)| f.as_str())
    }

    /// Identities declared for `scope`, as [`DiscoRegistry::features`].
    pub fn identities(&self, scope: IqScope, off: u64) -> impl Iterator<Item = &Identity> {
        let list = match scope {
            IqScope::Server => &self.server_identities,
            IqScope::Account => &self.account_identities,
        };
        list.iter()
            .filter(move |(_, d)| d.shown(off))
            .map(|(i, _)| i)
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
        assert_eq!(
            d.features(IqScope::Server, 0).collect::<Vec<_>>(),
            ["urn:b"]
        );
        assert_eq!(
            d.features(IqScope::Account, 0).collect::<Vec<_>>(),
            ["urn:a", "urn:b"]
        );
    }

    #[test]
    fn a_feature_is_hidden_only_when_every_module_that_declared_it_is_off() {
        let mut d = DiscoRegistry {
            current_bit: 0b01,
            ..Default::default()
        };
        d.feature(IqScope::Server, "urn:shared")
            .feature(IqScope::Server, "urn:one")
            .identity(IqScope::Server, "c", "one", None);
        d.current_bit = 0b10;
        d.feature(IqScope::Server, "urn:shared");
        d.current_bit = 0;
        d.feature(IqScope::Server, "urn:core");
        let shown = |off| d.features(IqScope::Server, off).collect::<Vec<_>>();
        assert_eq!(shown(0), ["urn:core", "urn:one", "urn:shared"]);
        assert_eq!(shown(0b01), ["urn:core", "urn:shared"]);
        assert_eq!(shown(0b11), ["urn:core"]);
        assert_eq!(d.identities(IqScope::Server, 0b01).count(), 0);
        assert_eq!(d.identities(IqScope::Server, 0b10).count(), 1);
    }
}
