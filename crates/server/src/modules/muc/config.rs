//! A room's configuration (XEP-0045 §10.2, the `muc#roomconfig` form of
//! §16.5.3) and the room information form (`muc#roominfo`, §16.5.4).
//!
//! Stored as JSON (`v` is the format version); unknown keys of a newer
//! version are ignored and missing keys take their defaults, so a rolling
//! upgrade reads both.

use super::MucConfig;
use serde::{Deserialize, Serialize};
use starling_core::forms::{FieldError, FormBuilder, Submitted};

/// `muc#roomconfig` FORM_TYPE.
pub const NS_ROOMCONFIG: &str = "http://jabber.org/protocol/muc#roomconfig";
/// `muc#roominfo` FORM_TYPE.
pub const NS_ROOMINFO: &str = "http://jabber.org/protocol/muc#roominfo";
/// Longest room name (`muc#roomconfig_roomname`), in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Longest room password (`muc#roomconfig_roomsecret`), in characters.
pub const MAX_PASSWORD_CHARS: usize = 200;

/// Who may see occupants' real JIDs (`muc#roomconfig_whois`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Whois {
    /// Semi-anonymous: moderators only.
    Moderators,
    /// Non-anonymous: every occupant.
    Anyone,
}

/// Who may send private messages (`muc#roomconfig_allowpm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllowPm {
    /// Every occupant.
    Anyone,
    /// Participants and moderators.
    Participants,
    /// Moderators only.
    Moderators,
    /// Nobody.
    None,
}

impl AllowPm {
    fn as_str(self) -> &'static str {
        match self {
            AllowPm::Anyone => "anyone",
            AllowPm::Participants => "participants",
            AllowPm::Moderators => "moderators",
            AllowPm::None => "none",
        }
    }
}

/// The stored configuration of one room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoomConfig {
    /// Format version.
    pub v: u32,
    /// Natural-language name.
    pub name: String,
    /// Short description.
    pub description: String,
    /// Language of the discussion.
    pub lang: String,
    /// Kept when the last occupant leaves.
    pub persistent: bool,
    /// Listed in the service's disco#items.
    pub public: bool,
    /// Only members may enter.
    pub members_only: bool,
    /// Only participants and moderators may speak; visitors by default.
    pub moderated: bool,
    /// Entering needs `password`.
    pub password_protected: bool,
    /// The room password (shared secret, sent in mediated invitations,
    /// XEP-0045 §7.8.2, so it is kept as given).
    pub password: String,
    /// Most occupants (owners and admins may enter past it).
    pub max_users: u32,
    /// Who sees real JIDs.
    pub whois: Whois,
    /// Who may send private messages.
    pub allow_pm: AllowPm,
    /// Occupants may invite others (else admins and owners only, in a
    /// members-only room).
    pub allow_invites: bool,
    /// Participants may change the subject (moderators always may).
    pub change_subject: bool,
    /// Messages are archived (XEP-0313 on the room JID) and kept across
    /// restarts for the history on entering.
    pub logging: bool,
    /// Most messages of history sent on entering (`muc#maxhistoryfetch`).
    pub history_size: u32,
    /// Roles whose presence is broadcast.
    pub presence_broadcast: Vec<String>,
    /// Roles that may get the member list.
    pub get_member_list: Vec<String>,
    /// Visitors may ask for voice (§7.13).
    pub voice_requests: bool,
    /// Secret of the room's stable occupant ids (XEP-0421).
    pub salt: String,
    /// The room's vCard (vcard-temp XML; empty: none), set by owners.
    pub vcard: String,
    /// SHA-1 of the vCard's photo (XEP-0153), hex; empty: no avatar.
    pub avatar_hash: String,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            v: 1,
            name: String::new(),
            description: String::new(),
            lang: String::new(),
            persistent: false,
            public: true,
            members_only: false,
            moderated: false,
            password_protected: false,
            password: String::new(),
            max_users: 200,
            whois: Whois::Moderators,
            allow_pm: AllowPm::Anyone,
            allow_invites: false,
            change_subject: false,
            logging: true,
            history_size: 20,
            presence_broadcast: vec!["moderator".into(), "participant".into(), "visitor".into()],
            get_member_list: vec!["moderator".into(), "participant".into()],
            voice_requests: true,
            salt: String::new(),
            vcard: String::new(),
            avatar_hash: String::new(),
        }
    }
}

const ROLES: [(&str, &str); 3] = [
    ("Moderator", "moderator"),
    ("Participant", "participant"),
    ("Visitor", "visitor"),
];

/// What a submitted configuration form changed besides the room's own
/// fields: the owner and admin lists when present.
#[derive(Debug, Default)]
pub struct FormLists {
    /// `muc#roomconfig_roomowners`.
    pub owners: Option<Vec<String>>,
    /// `muc#roomconfig_roomadmins`.
    pub admins: Option<Vec<String>>,
}

/// Why a submitted form was refused.
#[derive(Debug)]
pub enum FormProblem {
    /// A malformed value (`bad-request`).
    Bad(String),
    /// A value outside what the service allows (`not-acceptable`).
    NotAcceptable(String),
}

impl From<FieldError> for FormProblem {
    fn from(e: FieldError) -> Self {
        FormProblem::Bad(e.to_string())
    }
}

impl RoomConfig {
    /// A new room's configuration from the service defaults.
    pub fn new_room(svc: &MucConfig, salt: String) -> RoomConfig {
        RoomConfig {
            persistent: svc.default_persistent,
            public: svc.default_public,
            members_only: svc.default_members_only,
            moderated: svc.default_moderated,
            max_users: svc.default_max_users.min(svc.max_users),
            logging: svc.default_logging,
            history_size: svc.default_history.min(svc.max_history),
            salt,
            ..RoomConfig::default()
        }
    }

    /// Parses the stored form; `None` if it is not ours.
    pub fn from_stored(s: &str) -> Option<RoomConfig> {
        serde_json::from_str(s).ok()
    }

    /// The stored form.
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `role` is in a list of role names.
    pub fn lists(list: &[String], role: &str) -> bool {
        list.iter().any(|r| r == role)
    }

    /// The configuration form (§10.1.3, §10.2) with the current values
    /// and lists.
    pub fn form(&self, svc: &MucConfig, owners: &[String], admins: &[String]) -> FormBuilder {
        let maxusers = self.max_users.to_string();
        let mut max_options: Vec<String> = [10u32, 20, 30, 50, 100, 200, 500, 1000, 2000, 5000]
            .into_iter()
            .filter(|n| *n <= svc.max_users)
            .map(|n| n.to_string())
            .collect();
        if !max_options.contains(&maxusers) {
            max_options.push(maxusers.clone());
        }
        let max_opts: Vec<(&str, &str)> = max_options
            .iter()
            .map(|s| (s.as_str(), s.as_str()))
            .collect();
        fn roles(l: &[String]) -> Vec<&str> {
            l.iter().map(String::as_str).collect()
        }
        let owners: Vec<&str> = owners.iter().map(String::as_str).collect();
        let admins: Vec<&str> = admins.iter().map(String::as_str).collect();
        let history = self.history_size.to_string();
        FormBuilder::new("form", Some(NS_ROOMCONFIG))
            .title("Room configuration")
            .instructions("Your room is locked until you submit this form (an empty submission keeps these defaults).")
            .field("muc#roomconfig_roomname", "text-single", Some("Natural-language room name"), &[&self.name])
            .field("muc#roomconfig_roomdesc", "text-single", Some("Short description of the room"), &[&self.description])
            .field("muc#roomconfig_lang", "text-single", Some("Natural language of the discussion"), &[&self.lang])
            .boolean("muc#roomconfig_persistentroom", "Make room persistent", self.persistent)
            .boolean("muc#roomconfig_publicroom", "Make room publicly searchable", self.public)
            .boolean("muc#roomconfig_membersonly", "Make room members-only", self.members_only)
            .boolean("muc#roomconfig_moderatedroom", "Make room moderated", self.moderated)
            .boolean("muc#roomconfig_passwordprotectedroom", "Password required to enter", self.password_protected)
            .field("muc#roomconfig_roomsecret", "text-private", Some("Password"), &[&self.password])
            .field_with_options("muc#roomconfig_maxusers", "list-single", Some("Maximum number of occupants"), &[&maxusers], &max_opts)
            .field_with_options(
                "muc#roomconfig_whois",
                "list-single",
                Some("Who may discover occupants' real JIDs"),
                &[match self.whois {
                    Whois::Moderators => "moderators",
                    Whois::Anyone => "anyone",
                }],
                &[("Moderators only", "moderators"), ("Anyone", "anyone")],
            )
            .field_with_options(
                "muc#roomconfig_allowpm",
                "list-single",
                Some("Who may send private messages"),
                &[self.allow_pm.as_str()],
                &[("Anyone", "anyone"), ("Participants", "participants"), ("Moderators", "moderators"), ("Nobody", "none")],
            )
            .boolean("muc#roomconfig_allowinvites", "Occupants may invite others", self.allow_invites)
            .boolean("muc#roomconfig_changesubject", "Occupants may change the subject", self.change_subject)
            .boolean("muc#roomconfig_enablelogging", "Archive messages (history and MAM)", self.logging)
            .boolean("muc#roomconfig_allowvoicerequests", "Visitors may request voice", self.voice_requests)
            .field("muc#maxhistoryfetch", "text-single", Some("Most messages of history on entering"), &[&history])
            .field_with_options("muc#roomconfig_presencebroadcast", "list-multi", Some("Roles whose presence is broadcast"), &roles(&self.presence_broadcast), &ROLES)
            .field_with_options("muc#roomconfig_getmemberlist", "list-multi", Some("Roles that may get the member list"), &roles(&self.get_member_list), &ROLES)
            .field("muc#roomconfig_roomowners", "jid-multi", Some("Room owners"), &owners)
            .field("muc#roomconfig_roomadmins", "jid-multi", Some("Room admins"), &admins)
    }

    /// Applies a submitted form (fields absent keep their values), checking
    /// every value before changing anything.
    pub fn apply(
        &self,
        svc: &MucConfig,
        form: &Submitted,
    ) -> Result<(RoomConfig, FormLists), FormProblem> {
        if let Some(t) = form.form_type() {
            if t != NS_ROOMCONFIG {
                return Err(FormProblem::Bad(format!(
                    "FORM_TYPE must be {NS_ROOMCONFIG}"
                )));
            }
        }
        let mut c = self.clone();
        let text = |var: &'static str, max: usize, into: &mut String| -> Result<(), FormProblem> {
            if let Some(v) = form.single(var)? {
                if v.chars().count() > max {
                    return Err(FormProblem::NotAcceptable(format!(
                        "{var} is longer than {max} characters"
                    )));
                }
                *into = v.to_owned();
            }
            Ok(())
        };
        text("muc#roomconfig_roomname", MAX_NAME_CHARS, &mut c.name)?;
        text("muc#roomconfig_roomdesc", 1000, &mut c.description)?;
        text("muc#roomconfig_lang", 35, &mut c.lang)?;
        text(
            "muc#roomconfig_roomsecret",
            MAX_PASSWORD_CHARS,
            &mut c.password,
        )?;
        let flag = |var: &'static str, into: &mut bool| -> Result<(), FormProblem> {
            if let Some(b) = form.boolean(var)? {
                *into = b;
            }
            Ok(())
        };
        flag("muc#roomconfig_persistentroom", &mut c.persistent)?;
        flag("muc#roomconfig_publicroom", &mut c.public)?;
        flag("muc#roomconfig_membersonly", &mut c.members_only)?;
        flag("muc#roomconfig_moderatedroom", &mut c.moderated)?;
        flag(
            "muc#roomconfig_passwordprotectedroom",
            &mut c.password_protected,
        )?;
        flag("muc#roomconfig_allowinvites", &mut c.allow_invites)?;
        flag("muc#roomconfig_changesubject", &mut c.change_subject)?;
        flag("muc#roomconfig_enablelogging", &mut c.logging)?;
        flag("muc#roomconfig_allowvoicerequests", &mut c.voice_requests)?;
        if c.persistent && !self.persistent && !svc.allow_persistent {
            return Err(FormProblem::NotAcceptable(
                "this service does not keep rooms: persistent rooms are disabled".into(),
            ));
        }
        if let Some(v) = form.single("muc#roomconfig_maxusers")? {
            let n: u32 = match v.trim() {
                "none" | "" => svc.max_users,
                s => s.parse().map_err(|_| {
                    FormProblem::Bad("muc#roomconfig_maxusers must be a number".into())
                })?,
            };
            if n == 0 || n > svc.max_users {
                return Err(FormProblem::NotAcceptable(format!(
                    "muc#roomconfig_maxusers must be between 1 and {}",
                    svc.max_users
                )));
            }
            c.max_users = n;
        }
        if let Some(v) = form.single("muc#maxhistoryfetch")? {
            let n: u32 = v
                .trim()
                .parse()
                .map_err(|_| FormProblem::Bad("muc#maxhistoryfetch must be a number".into()))?;
            if n > svc.max_history {
                return Err(FormProblem::NotAcceptable(format!(
                    "muc#maxhistoryfetch is at most {}",
                    svc.max_history
                )));
            }
            c.history_size = n;
        }
        if let Some(v) = form.single("muc#roomconfig_whois")? {
            c.whois = match v.trim() {
                "moderators" => Whois::Moderators,
                "anyone" => Whois::Anyone,
                _ => {
                    return Err(FormProblem::Bad(
                        "muc#roomconfig_whois is moderators or anyone".into(),
                    ))
                }
            };
        }
        if let Some(v) = form.single("muc#roomconfig_allowpm")? {
            c.allow_pm = match v.trim() {
                "anyone" => AllowPm::Anyone,
                "participants" => AllowPm::Participants,
                "moderators" => AllowPm::Moderators,
                "none" => AllowPm::None,
                _ => {
                    return Err(FormProblem::Bad(
                        "muc#roomconfig_allowpm is anyone, participants, moderators or none".into(),
                    ))
                }
            };
        }
        for (var, into) in [
            (
                "muc#roomconfig_presencebroadcast",
                &mut c.presence_broadcast,
            ),
            ("muc#roomconfig_getmemberlist", &mut c.get_member_list),
        ] {
            if let Some(values) = form.values(var) {
                let mut roles = Vec::new();
                for v in values {
                    let v = v.trim();
                    if !ROLES.iter().any(|(_, r)| *r == v) {
                        return Err(FormProblem::Bad(format!("{var}: {v} is not a role")));
                    }
                    if !roles.iter().any(|r: &String| r == v) {
                        roles.push(v.to_owned());
                    }
                }
                *into = roles;
            }
        }
        if c.password_protected && c.password.is_empty() {
            return Err(FormProblem::NotAcceptable(
                "a password-protected room needs muc#roomconfig_roomsecret".into(),
            ));
        }
        let jids = |var: &str| -> Result<Option<Vec<String>>, FormProblem> {
            let Some(values) = form.values(var) else {
                return Ok(None);
            };
            let mut out = Vec::new();
            for v in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
                let j = starling_proto::BareJid::new(v)
                    .map_err(|_| FormProblem::Bad(format!("{var}: {v} is not a bare JID")))?;
                out.push(j.to_string());
            }
            Ok(Some(out))
        };
        let lists = FormLists {
            owners: jids("muc#roomconfig_roomowners")?,
            admins: jids("muc#roomconfig_roomadmins")?,
        };
        Ok((c, lists))
    }

    /// The `muc#roominfo` form of disco#info (§6.4, §16.5.4).
    pub fn info_form(&self, occupants: usize, subject: &str) -> FormBuilder {
        let occupants = occupants.to_string();
        let history = self.history_size.to_string();
        FormBuilder::new("result", Some(NS_ROOMINFO))
            .field(
                "muc#roomconfig_roomname",
                "text-single",
                Some("Natural-language room name"),
                &[&self.name],
            )
            .field(
                "muc#roominfo_description",
                "text-single",
                Some("Description"),
                &[&self.description],
            )
            .field(
                "muc#roominfo_lang",
                "text-single",
                Some("Language"),
                &[&self.lang],
            )
            .field(
                "muc#roominfo_occupants",
                "text-single",
                Some("Number of occupants"),
                &[&occupants],
            )
            .field(
                "muc#roominfo_subject",
                "text-single",
                Some("Current subject"),
                &[subject],
            )
            .boolean(
                "muc#roominfo_subjectmod",
                "Occupants may change the subject",
                self.change_subject,
            )
            .field(
                "muc#maxhistoryfetch",
                "text-single",
                Some("Most messages of history"),
                &[&history],
            )
            .field(
                "muc#roominfo_avatarhash",
                "text-multi",
                Some("Avatar hash"),
                &if self.avatar_hash.is_empty() {
                    vec![]
                } else {
                    vec![self.avatar_hash.as_str()]
                },
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> MucConfig {
        MucConfig::default()
    }

    #[test]
    fn a_submitted_form_changes_only_its_fields_and_checks_them_all() {
        let c = RoomConfig::new_room(&svc(), "s".into());
        let form = FormBuilder::new("submit", Some(NS_ROOMCONFIG))
            .field("muc#roomconfig_roomname", "text-single", None, &["Lobby"])
            .boolean("muc#roomconfig_moderatedroom", "", true)
            .field("muc#roomconfig_maxusers", "list-single", None, &["50"])
            .build();
        let (n, lists) = c.apply(&svc(), &Submitted::parse(&form)).unwrap();
        assert_eq!(n.name, "Lobby");
        assert!(n.moderated);
        assert_eq!(n.max_users, 50);
        assert_eq!(n.public, c.public);
        assert!(lists.owners.is_none());
        for (var, value) in [
            ("muc#roomconfig_moderatedroom", "maybe"),
            ("muc#roomconfig_maxusers", "lots"),
            ("muc#roomconfig_whois", "everybody"),
            ("muc#roomconfig_presencebroadcast", "king"),
            ("muc#roomconfig_roomowners", "not a jid@"),
        ] {
            let form = FormBuilder::new("submit", None)
                .field(var, "text-single", None, &[value])
                .build();
            assert!(
                matches!(
                    c.apply(&svc(), &Submitted::parse(&form)),
                    Err(FormProblem::Bad(_))
                ),
                "{var}={value}"
            );
        }
        let form = FormBuilder::new("submit", None)
            .field("muc#roomconfig_maxusers", "list-single", None, &["100000"])
            .build();
        assert!(matches!(
            c.apply(&svc(), &Submitted::parse(&form)),
            Err(FormProblem::NotAcceptable(_))
        ));
        let form = FormBuilder::new("submit", None)
            .boolean("muc#roomconfig_passwordprotectedroom", "", true)
            .build();
        assert!(matches!(
            c.apply(&svc(), &Submitted::parse(&form)),
            Err(FormProblem::NotAcceptable(_))
        ));
    }

    #[test]
    fn stored_config_round_trips_and_tolerates_unknown_keys() {
        let c = RoomConfig::new_room(&svc(), "salt".into());
        assert_eq!(RoomConfig::from_stored(&c.to_stored()), Some(c.clone()));
        let newer = c.to_stored().replacen('{', "{\"future_key\":7,", 1);
        assert_eq!(RoomConfig::from_stored(&newer), Some(c));
        assert_eq!(
            RoomConfig::from_stored("{\"name\":\"x\"}").unwrap().name,
            "x"
        );
    }
}
